"""The resume-reliability planted bugs (shard identities, state validation, the error
for another rank's state, set_epoch after a load): ``tests/planted`` gathers them
with the others. Each must make the test files named beside it fail."""

from __future__ import annotations

from tests.planted._mutant import planted

LIST = "tests/sources/test_resume_shard_list.py"
CHECKS = "tests/test_resume_checks.py"
IDENTITY = "streambuf/_identity.py"
SCHEMA = "streambuf/_schema.py"
STATE_SCHEMA = "streambuf/_state_schema.py"
CORRUPTED = CHECKS + "::test_every_corrupted_field_is_one_value_error_at_load"
CHAIN = "tests/test_chain_shutdown.py"


_m = planted("reliability")


MUTANTS = [
    _m(
        "shard identity by count only (no names in the state)",
        IDENTITY,
        "out = encode_names(names) if names is not None else None",
        "out = None",
        LIST,
    ),
    _m(
        "a reordered list resumes by position",
        IDENTITY,
        "    return [f[0] for f in found]",
        "    return None",
        LIST,
    ),
    _m(
        "the query string is part of a shard's identity",
        IDENTITY,
        '# a URL: its query string and fragment are not its identity\n        item = item.split("#", 1)[0].split("?", 1)[0]',
        "# a URL: its query string and fragment are not its identity\n        item = item",
        LIST,
    ),
    _m(
        "shards of one name in two folders identified by the name alone",
        IDENTITY,
        "        if len(members) < 2:\n            continue",
        "        if True:\n            continue",
        f"{LIST}::test_folders_of_equal_names_swapped_at_resume_every_sample_once",
    ),
    _m(
        "a saved name is matched only where it is the longer identity",
        IDENTITY,
        ' or now.endswith("/" + saved)',
        "",
        f"{LIST}::test_a_name_that_two_shards_of_the_new_list_match_is_refused",
    ),
    _m(
        "two saved shards may map to one new shard",
        IDENTITY,
        " or taken[f[0]] > 1}",
        "}",
        f"{LIST}::test_a_name_that_two_shards_of_the_new_list_match_is_refused",
    ),
    _m(
        "duplicate names mapped anyway",
        IDENTITY,
        "    if ambiguous:\n",
        "    if False:\n",
        LIST,
    ),
    _m(
        "elastic progress keeps the old shard indices",
        "streambuf/_elastic.py",
        "out.claims[mapping[shard]] = list(claims)",
        "out.claims[shard] = list(claims)",
        LIST,
    ),
    _m(
        "state validation skips upper bounds",
        SCHEMA,
        "or (hi is not None and value >= hi)",
        "or False",
        CHECKS,
    ),
    _m(
        "state validation accepts negative ints",
        SCHEMA,
        "(lo is not None and value < lo)",
        "(lo is not None and value < lo and lo > 0)",
        CHECKS,
    ),
    _m(
        "state validation takes a bool for an int",
        SCHEMA,
        "or isinstance(value, bool)\n",
        "or False\n",
        CHECKS,
    ),
    _m(
        "state validation skips missing keys",
        SCHEMA,
        'raise ValueError(f"{path}: the key {key!r} is missing")',
        "continue",
        CHECKS,
    ),
    _m(
        "state validation takes a claim's stride of 0",
        STATE_SCHEMA,
        "List(List(items=[Int(1), Int(0), Opt(Int(0)), RESUME_HINT], min_len=4))",
        "List(List(items=[Int(0), Int(0), Opt(Int(0)), RESUME_HINT], min_len=4))",
        CORRUPTED,
    ),
    _m(
        "state validation takes group positions past the shard count",
        STATE_SCHEMA,
        'GROUPS = List(List(List(items=[Int(0, "shards"), Int(0)]',
        "GROUPS = List(List(List(items=[Int(0), Int(0)]",
        CORRUPTED,
    ),
    _m(
        "state validation takes claim keys past the shard count",
        STATE_SCHEMA,
        '"claims": MapOf(\n            Int(0, "shards"),',
        '"claims": MapOf(\n            Int(0),',
        CORRUPTED,
    ),
    _m(
        "state validation takes sets keys past the shard count",
        STATE_SCHEMA,
        '"sets": MapOf(Int(0, "shards")',
        '"sets": MapOf(Int(0)',
        CORRUPTED,
    ),
    _m(
        "state validation takes a names run of width 0",
        STATE_SCHEMA,
        "Str(), Str(), Int(1, 65),",
        "Str(), Str(), Int(0, 65),",
        CORRUPTED,
    ),
    _m(
        "state validation takes a names run without its count",
        STATE_SCHEMA,
        "Int(1, 1 << 31)], min_len=6)",
        "Int(1, 1 << 31)])",
        CORRUPTED,
    ),
    _m(
        "state validation takes a fetch hint of three offsets",
        STATE_SCHEMA,
        "List(Int(0), min_len=2, max_len=2)),",
        "List(Int(0), min_len=2)),",
        CORRUPTED,
    ),
    _m(
        "state validation takes next_lane one past the last lane",
        STATE_SCHEMA,
        'Int(0, len(value["lanes"])).check(',
        'Int(0, len(value["lanes"]) + 1).check(',
        CORRUPTED,
    ),
    _m(
        "states not validated before use",
        "streambuf/_state.py",
        '    validate(state, stage_keys=stage_keys(pipe), mix=pipe._src.state_kind == "mix", path=path)\n',
        "",
        CHECKS,
    ),
    _m(
        "another rank's state: the message names the loading rank as the saver",
        "streambuf/_state.py",
        "f\"this state was saved by rank {layout['rank']} of a run with \"",
        'f"this state was saved by rank {rank} of a run with "',
        CHECKS,
    ),
    _m(
        "set_epoch after load_state_dict not checked",
        "streambuf/_checkpoint.py",
        "        if self._loaded is not None:\n            _state.check_set_epoch(",
        "        if False:\n            _state.check_set_epoch(",
        CHECKS,
    ),
    _m(
        "loader.epoch ignores the loaded state",
        "streambuf/loader.py",
        "        if loaded is not None:\n            return loaded\n",
        "",
        CHECKS,
    ),
    _m(
        "a lane leaving a shard mid-read leaves its reader open until it is collected",
        "streambuf/_source.py",
        '                close = getattr(reader, "close", None)\n                if close',
        "                close = None\n                if close",
        "tests/sources/test_adaptive_lanes.py::test_a_reader_stuck_in_a_read_is_closed_when_it_returns",
    ),
    _m(
        "a threaded map leaves its upstream stage running when it stops (till a GC)",
        "streambuf/stages.py",
        "                adaptive=self.adaptive,\n                close_source=True,",
        "                adaptive=self.adaptive,\n                close_source=False,",
        f"{CHAIN}::test_every_threaded_stage_of_a_chain_stops_when_the_consumer_stops",
    ),
    _m(
        "a stage stopped while a thread reads its source never closes that source",
        "streambuf/prefetch.py",
        "            if self._stopped:  # the stage stopped while this thread",
        "            if False:  # the stage stopped while this thread",
        "tests/test_prefetch.py::test_an_owned_source_is_closed_at_the_stop_even_from_inside_a_read",
    ),
    _m(
        "a closed lane runner keeps its gate (a cycle: the stage is freed only by a GC)",
        "streambuf/_lanes.py",
        "self._on_close = self._describe = self._gate = None",
        "self._on_close = self._describe = None",
        "tests/test_prefetch.py::test_a_closed_stage_is_freed_by_reference_counting",
    ),
    _m(
        "a closed stage's tuner keeps its room callback (a cycle: freed only by a GC)",
        "streambuf/_tuner.py",
        '        closed stage is freed by reference counting, not at a later garbage collection."""\n'
        "        self._room = self._held = None",
        '        closed stage is freed by reference counting, not at a later garbage collection."""\n'
        "        pass",
        "tests/test_prefetch.py::test_a_closed_stage_is_freed_by_reference_counting",
    ),
    _m(
        "a closed stage's tuner keeps its held callback (a cycle: freed only by a GC)",
        "streambuf/_tuner.py",
        "        self._room = self._held = None",
        "        self._room = None",
        "tests/test_prefetch.py::test_a_closed_stage_is_freed_by_reference_counting",
    ),
    _m(
        "Loader.close() leaves the in-process iteration it handed out running",
        "streambuf/loader.py",
        "live = self._live() if self._live is not None else None",
        "live = None",
        f"{CHAIN}::test_every_threaded_stage_of_a_chain_stops_when_the_consumer_stops",
    ),
    _m(
        "an error while closing the upstream stage replaces the error being delivered",
        "streambuf/prefetch.py",
        "            try:\n                close()\n            except Exception as exc:  # closing",
        "            try:\n                close()\n            except ZeroDivisionError as exc:  # closing",
        f"{CHAIN}::test_a_failing_clean_up_upstream_does_not_replace_the_error",
    ),
    _m(
        "Loader.close() from another thread leaves an in-process iteration running",
        "streambuf/loader.py",
        "                if self._closed:  # close() from another thread: end at this batch",
        "                if False:  # close() from another thread: end at this batch",
        f"{CHAIN}::test_loader_close_from_another_thread_ends_an_in_process_iteration",
    ),
    _m(
        "a mix saves a state although one of its sources is a one-shot iterable",
        "streambuf/mixing.py",
        "            refused = p._src.state_refusal()\n            if refused is not None:\n"
        '                return f"{self.label(k)}: {refused}"',
        "            refused = p._src.state_refusal()\n            if refused is None:\n"
        '                return f"{self.label(k)}: {refused}"',
        "tests/test_mixing.py::test_a_mix_with_a_one_shot_source_refuses_to_save_and_names_it",
    ),
    _m(
        "map() on one thread lets fn's StopIteration end the stream (the built-in map's end)",
        "streambuf/stages.py",
        "        except StopIteration as stop:  # not the end of the stream (the built-in map's)\n",
        "        except ArithmeticError as stop:  # not the end of the stream (the built-in map's)\n",
        "tests/test_fn_stop_iteration.py",
    ),
    _m(
        "a bare ThreadPrefetcher lets fn's StopIteration through",
        "streambuf/prefetch.py",
        "        except StopIteration as stop:  # from fn: it must not end the stream\n",
        "        except ArithmeticError as stop:  # from fn: it must not end the stream\n",
        "tests/test_fn_stop_iteration.py",
    ),
    _m(
        "a ThreadPrefetcher running inline lets fn's StopIteration out as PEP 479's error",
        "streambuf/prefetch.py",
        "        except StopIteration as stop:  # from fn, inline: not the end of the stream either\n",
        "        except ArithmeticError as stop:  # from fn, inline: not the end of the stream either\n",
        "tests/test_fn_stop_iteration.py::test_a_thread_prefetcher_running_inline_raises_it_too",
    ),
    _m(
        "a nodes mapper whose map_fn failed keeps its threads (the error holds the node)",
        "streambuf/nodes/map.py",
        "            self._failed = exc\n            self._close()\n",
        "            self._failed = exc\n",
        "tests/test_nodes.py::test_a_graph_whose_map_fn_failed_stops_its_threads_when_dropped",
    ),
    _m(
        "reserve() counts a reservation before checking its size",
        "streambuf/_engine.py",
        '        nbytes = check_nbytes(nbytes, name="nbytes")  # (before anything is counted)\n',
        "",
        "tests/test_buffer_misuse.py",
    ),
    _m(
        "a cancel without a reservation frees room that is not there",
        "streambuf/_engine.py",
        "        if lane.reserved <= 0:\n",
        "        if False:\n",
        "tests/test_buffer_misuse.py",
    ),
    _m(
        "a cancel gives back more bytes than were reserved",
        "streambuf/_engine.py",
        "        if nbytes > lane.reserved_bytes:\n",
        "        if False:\n",
        "tests/test_buffer_misuse.py",
    ),
    _m(
        "ShardedBuffer.cancel leaves its reservation for release() to give back again",
        "streambuf/buffer.py",
        "                del open_[k]  # (a release() after it gives nothing back)\n",
        "                pass\n",
        "tests/test_buffer_misuse.py",
    ),
    _m(
        "ShardedBuffer.finish takes a lane counted from the end",
        "streambuf/buffer.py",
        "        self._lane_index(lane)\n        self._finish(lane)",
        "        self._finish(lane)",
        "tests/test_buffer_misuse.py",
    ),
    _m(
        "ThreadPrefetcher takes join_timeout_s unchecked (close() fails at break)",
        "streambuf/prefetch.py",
        '        join_timeout_s = check_seconds(join_timeout_s, name="join_timeout_s", allow_zero=True)\n',
        "",
        "tests/test_options.py::test_thread_prefetcher_refuses_bad_options_when_built",
    ),
    _m(
        "Window.get_many(0) returns an item",
        "streambuf/window.py",
        "        if type(most) is not int or most < 1:\n",
        "        if False:\n",
        "tests/test_window.py::test_get_many_refuses_a_bad_count_like_the_buffer",
    ),
    _m(
        "Window.reserve counts a negative size",
        "streambuf/window.py",
        "        if type(nbytes) is not int or nbytes < 0:  # (a negative size would free room)\n",
        "        if False:\n",
        "tests/test_window.py::test_reserve_refuses_a_bad_size_and_counts_nothing",
    ),
    _m(
        "forked workers collect (and finalize) the parent's garbage",
        "streambuf/loader.py",
        "with frozen_for_fork(self._ctx.get_start_method()):",
        "with frozen_for_fork(None):",
        "tests/test_forking.py",
    ),
]
MUTANTS += [
    _m(
        "budget: a batch larger than its reservation is added on top of the held ones",
        "streambuf/_worker.py",
        "                if size > estimate:  # reserved again at its real size: it fits, or alone",
        "                if False:",
        "tests/test_loader_budget.py::test_a_batch_larger_than_its_reservation_waits_for_room",
    ),
    _m(
        "budget: a worker reserves the largest batch of the epoch",
        "streambuf/_worker.py",
        "                estimate = max(max(recent), 1)",
        "                estimate = max(estimate, size, 1)",
        "tests/test_loader_budget.py::"
        "test_one_large_batch_does_not_shrink_the_depth_for_the_rest_of_the_epoch",
    ),
    _m(
        "budget: a worker reserves nothing for the batch it builds (each one reserved once built)",
        "streambuf/_worker.py",
        "                estimate = max(max(recent), 1)",
        "                estimate = 1",
        "tests/video/test_loader_video.py::test_byte_budget_holds_for_720p_clips",
    ),
    _m(
        "budget: a batch of clips is charged without its frames",
        "streambuf/sizing.py",
        "for f in dataclasses.fields(obj))",
        "for f in dataclasses.fields(obj) if f.name != 'data')",
        "tests/video/test_loader_video.py::test_byte_budget_holds_for_720p_clips",
    ),
    _m(
        "loader: an iteration left early waits for its busy workers",
        "streambuf/loader.py",
        "        elif early and not failed and not self.persistent_workers and dl_iter is not None:",
        "        elif False:",
        "tests/test_loader.py::test_a_stage_error_reaches_the_loop_without_waiting_for_busy_workers",
        "tests/test_loader.py::test_a_break_returns_without_waiting_for_busy_workers",
    ),
]
MUTANTS += [
    _m(
        "worker: an error building its iteration escapes streambuf's error path",
        "streambuf/_worker.py",
        "            batches = iter(it)\n        except Exception as exc:",
        "            batches = iter(it)\n        except ZeroDivisionError as exc:",
        "tests/test_loader.py::test_a_plan_a_worker_cannot_run_comes_through_streambufs_error_path",
    ),
    _m(
        "equalize='drop' with a rank without a batch drops the whole epoch silently",
        "streambuf/sharding.py",
        '    if mode == "drop" and target == 0 and progress is None and any(totals):',
        "    if False:",
        "tests/test_sharding.py::test_equal_batch_counts_drop_refuses_to_drop_the_whole_epoch",
    ),
]
MUTANTS += [
    _m(
        "budget: a batch reserved again at its size waits behind the others (pooled)",
        "streambuf/budget.py",
        "                    ahead = self.pooled and self._g[_G_FIRST] not in (0, me)",
        "                    ahead = False",
        "tests/test_budget.py::test_a_batch_reserved_again_at_its_size_is_served_first_when_pooled",
    ),
    _m(
        "arena: a built batch that is not sent keeps its slot",
        "streambuf/_arena.py",
        "                    self._state[at // self.slot_bytes] = 0",
        "                    pass",
        "tests/test_arena.py::test_a_built_batch_that_is_not_sent_gives_its_slot_back",
    ),
]
MUTANTS += [
    _m(
        "loader: a loop left as the program ends starts a shutdown thread (it never runs)",
        "streambuf/loader.py",
        "        if early and not failed and not self.persistent_workers and sys.is_finalizing():",
        "        if False:",
        "tests/test_loader_faults.py::test_a_loop_closed_as_the_interpreter_ends_starts_no_thread",
    ),
    _m(
        "a state with a group partly delivered after a shuffle loads (refused only later)",
        "streambuf/_state.py",
        "    if regrouped is not None and not complete and _holds_groups(states):",
        "    if False:",
        "tests/test_custom_stage.py::test_a_group_after_a_shuffle_is_refused_when_the_state_is_loaded",
    ),
]
