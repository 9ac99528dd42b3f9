"""The planted bugs of "Autotuned parallelism": the thread-count controller's rules
(``streambuf._tuner``) and the lanes that carry its counts out (``streambuf._lanes``,
``streambuf.prefetch``). Each must make the tests named beside it fail."""

from __future__ import annotations

from tests.planted._mutant import planted

_m = planted("autotune", default_file="tests/test_threads_auto.py")

MUTANTS = [
    _m(
        "the controller never shrinks (a GIL-bound function keeps its threads)",
        "streambuf/_tuner.py",
        "            new = self._below(self._from)\n",
        "            new = self._from\n",
        "::test_shrinks_to_one_thread_under_gil_bound_work",
    ),
    _m(
        "the controller ignores the byte bound when growing",
        "streambuf/_tuner.py",
        "        return max(1, min(self.max_threads, room))",
        "        return self.max_threads",
        "::test_stops_at_the_byte_room",
        "::test_the_byte_bound_caps_the_count_and_holds",
    ),
    _m(
        "the controller grows while its threads fight for cores",
        "streambuf/_tuner.py",
        "        if self.contended:\n",
        "        if False:\n",
        "::test_stops_growing_where_its_threads_wait_for_cores",
    ),
    _m(
        "a window counts the items delivered, not those made (a step down reads the buffer)",
        "streambuf/_tuner.py",
        "        return self._n + (self._held() if self._held is not None else 0)",
        "        return self._n",
        "::test_a_step_down_is_measured_by_what_the_threads_make",
    ),
    _m(
        "a window is measured from where it began, not from a burst's start",
        "streambuf/_tuner.py",
        "                return self._measured((made - made_first) / max(now - t_first, 1e-9))",
        "                return self._measured((self._made() - self._made0) / max(dt, 1e-9))",
        "::test_a_bursty_consumer_is_measured_over_whole_bursts",
    ),
    _m(
        "a window ends inside a burst",
        "streambuf/_tuner.py",
        "                begins\n                and len(starts) > self.cycles\n",
        "                len(starts) > self.cycles\n",
        "::test_a_bursty_consumer_is_measured_over_whole_bursts",
    ),
    _m(
        "burst starts are pruned only from the front when the longest pause grows",
        "streambuf/_tuner.py",
        "            self._starts = starts = deque(e for e in starts if e[0] >= cut)\n",
        "            while starts and starts[0][0] < cut:\n                starts.popleft()\n",
        "::test_burst_starts_are_counted_against_the_longest_pause",
    ),
    _m(
        "a window holds one burst, not cycles",
        "streambuf/_tuner.py",
        "                and len(starts) > self.cycles\n",
        "                and len(starts) > 1\n",
        "::test_a_window_holds_several_bursts",
    ),
    _m(
        "a re-check goes down while the rate stays above half the best",
        "streambuf/_tuner.py",
        "            floor = self.fall if self.settled_s is None else self.keep\n",
        "            floor = self.fall\n",
        "::test_a_recheck_goes_down_only_while_a_step_loses_nothing",
    ),
    _m(
        "contended, the controller takes the fewest threads within keep of the best",
        "streambuf/_tuner.py",
        "                count = min(c for c in near if c == count or self._rates[c] >= same)",
        "                count = min(near)",
        "::test_contended_fewer_threads_are_kept_only_if_they_lose_nothing",
    ),
    _m(
        "a retired thread drops the item it made",
        "streambuf/_lanes.py",
        "                got = next(it)\n",
        "                got = next(it)\n"
        "                if gate is not None and lane >= gate.__self__._active:  # type: ignore\n"
        "                    win.release(lane)\n"
        "                    continue\n",
        "::test_order_and_exactly_once_while_threads_come_and_go[False]",
    ),
    _m(
        "lanes never started are not finished when the source ends (a hang)",
        "streambuf/_lanes.py",
        "            for group in self._groups[len(self._threads) :]:\n"
        "                for lane in group:\n"
        "                    self.window.finish(lane)\n",
        "            pass\n",
        "::test_a_short_source_ends_with_lanes_never_started",
    ),
]
MUTANTS += [
    _m(
        "lanes='auto' resolves to the old default count, not AUTO_LANES",
        "streambuf/sources/options.py",
        '        return AUTO_LANES if self.lanes == "auto" else int(self.lanes)',
        '        return 3 if self.lanes == "auto" else int(self.lanes)',
        "tests/sources/test_lanes_auto.py::test_auto_is_a_fixed_count_with_the_fixed_counts_order",
    ),
    _m(
        "the source reports lanes='auto' as it was given (a resume sees changed lanes)",
        "streambuf/sources/pipe.py",
        "        return self.options.lane_count, self.options.order",
        "        return self.options.lanes, self.options.order  # type: ignore[return-value]",
        "tests/sources/test_lanes_auto.py::test_resume_is_exact_with_lanes_auto",
    ),
]
MUTANTS += [
    _m(
        "the controller keeps a count, contended, when fewer threads do as much",
        "streambuf/_tuner.py",
        "            if self._contended_from:\n",
        "            if False:\n",
        "::test_a_plateau_keeps_its_count_unless_the_stage_is_contended",
    ),
    _m(
        "the first decision, made in the start-up, waits the full interval for a re-check",
        "streambuf/_tuner.py",
        "            self._interval = min(self._interval, self.first_recheck_s)\n",
        "            pass\n",
        "::test_the_first_decision_is_checked_again_soon",
    ),
    _m(
        "the controller moves on noise (no preference for the count it has)",
        "streambuf/_tuner.py",
        "        if self._from in near:\n            count = self._from\n",
        "        if False:\n            count = self._from\n",
        "::test_a_plateau_keeps_its_count_unless_the_stage_is_contended",
    ),
    _m(
        "paused lanes keep their reservation (wait inside the pull)",
        "streambuf/prefetch.py",
        "            if self._paused:\n                return AGAIN\n",
        "            while self._paused and not self._stopped:\n"
        "                self._src_lock.release()\n"
        "                threading.Event().wait(0.001)\n"
        "                self._src_lock.acquire()\n"
        "            if self._stopped:\n                return _END\n",
        "::test_paused_lanes_hold_no_room_while_the_consumer_drains[8-False]",
    ),
    _m(
        "followers ignore the leader (every worker climbs alone)",
        "streambuf/prefetch.py",
        "        self._lead = lead if auto and lead is not None and not lead.leader else None",
        "        self._lead = None",
        "::test_a_follower_takes_the_leaders_count_and_climbs_alone_when_the_leader_stops",
    ),
    _m(
        "a follower takes the leader's count past its own max_threads",
        "streambuf/prefetch.py",
        "                    want = max(tuner.least, min(want, self._threads_n, self._room()))",
        "                    want = max(tuner.least, want)",
        "::test_a_follower_takes_the_leaders_count_and_climbs_alone_when_the_leader_stops",
    ),
    _m(
        "a follower whose leader stopped never climbs again",
        "streambuf/prefetch.py",
        "                elif self._following:  # the leader is gone: climb from here alone",
        "                elif False:",
        "::test_a_follower_takes_the_leaders_count_and_climbs_alone_when_the_leader_stops",
    ),
    _m(
        "adopt keeps the old count (a follower climbs from where it was, not the leader's)",
        "streambuf/_tuner.py",
        "        self.count = max(self.least, min(int(count), self.limit()))",
        "        pass",
        "::test_adopt_checks_again_from_the_count_it_is_given",
    ),
    _m(
        "a Loader's map stage is built without its lead (every worker climbs alone)",
        "streambuf/stages.py",
        "                lead=_thread_lead(self.counters) if auto else None,",
        "                lead=None,",
        "::test_loader_workers_take_worker_0s_count",
    ),
    _m(
        "a follower takes the leader's count past its own byte room",
        "streambuf/prefetch.py",
        "                    want = max(tuner.least, min(want, self._threads_n, self._room()))",
        "                    want = max(tuner.least, min(want, self._threads_n))",
        "::test_a_follower_stays_within_its_own_byte_room",
    ),
]
_lt = "tests/sources/test_lane_threads.py"
MUTANTS += [
    _m(
        "a thread over several lanes takes them in lane order, not delivery order (a "
        "deadlock when the window starts at another lane)",
        "streambuf/_lanes.py",
        "            ahead = sorted(run, key=lambda t: (t - first_lane) % self._lanes)",
        "            ahead = sorted(run)",
        _lt + "::test_fewer_threads_than_lanes_keep_the_order_in_a_tight_window",
    ),
    _m(
        "a thread-count change stops each lane at once, not at a round's end (order lost)",
        "streambuf/_source.py",
        "                else max(m + d for m, d in zip(self._made, self._driving))\n"
        "            )\n\n    def _gated",
        "                else 0\n            )\n\n    def _gated",
        _lt + "::test_a_change_ends_the_phase_at_a_rounds_end_when_lanes_run_ahead",
    ),
    _m(
        "a phase runs one thread per lane, whatever the lane tuner's count",
        "streambuf/_source.py",
        "        return max(1, min(self.tuner.count, self._room(), sum(",
        "        return max(1, min(self.threads, self._room(), sum(",
        _lt + "::test_the_phases_run_the_tuners_count",
    ),
    _m(
        "a lane phase runs the tuner's count past the byte room",
        "streambuf/_source.py",
        "        return max(1, min(self.tuner.count, self._room(), sum(not d",
        "        return max(1, min(self.tuner.count, sum(not d",
        _lt + "::test_the_threads_stay_within_the_byte_room",
    ),
    _m(
        "threads whose lanes ran out are not dealt the lanes left (they idle)",
        "streambuf/_source.py",
        "                    self._regroup = self.phases[-1] < sum(not d for d in self._done)",
        "                    self._regroup = False",
        _lt + "::test_threads_come_back_to_work_when_their_lanes_run_out",
    ),
    _m(
        "a new phase's runner forgets the sample size (reservations of a lane's share)",
        "streambuf/_source.py",
        "            largest=self._largest,\n",
        "            largest=-1,\n",
        _lt + "::test_a_new_phase_reserves_the_known_sample_size",
    ),
    _m(
        "a mix does not give its sources' thread gauges back when the workers end",
        "streambuf/mixing.py",
        "        for p in self.pipelines:\n            p._workers_ended()\n",
        "        pass\n",
        _lt + "::test_a_mix_gives_its_sources_thread_gauges_back_when_workers_end",
    ),
    _m(
        "a lane-count change is never asked for (the tuner's count is not carried out)",
        "streambuf/_source.py",
        "                    if tuner.tick() is not None and self._want() != threads:",
        "                    if tuner.tick() is not None and False:",
        _lt + "::test_the_phases_run_the_tuners_count",
    ),
]
MUTANTS += [
    _m(
        "lane threads start at 4, not one per lane (the first requests wait for each other)",
        "streambuf/_source.py",
        "                max_threads=k,\n                start=k,\n",
        "                max_threads=k,\n                start=min(4, k),\n",
        _lt + "::test_the_tuner_keeps_a_thread_per_lane_where_every_lane_waits",
    ),
]
MUTANTS += [
    _m(
        "ThreadStats.mean reads 0 (threads per worker over the run are not reported)",
        "streambuf/_counters.py",
        '    mean = c["thread_ns"] / c["run_ns"] if c["run_ns"] else 0.0',
        "    mean = 0.0",
        _lt + "::test_auto_lanes_in_a_loader_report_their_threads",
    ),
]
_vc = "tests/video/test_clips_pipeline.py"
MUTANTS += [
    _m(
        "video threads='auto' decodes another count of videos at once (another order)",
        "streambuf/video/source.py",
        '            return AUTO_DECODE_LANES, "round_robin"',
        '            return 2, "round_robin"',
        _vc + "::test_threads_auto_decodes_four_videos_at_once_in_their_order",
    ),
    _m(
        "video threads='auto' runs one thread per lane (the tuner is never asked)",
        "streambuf/video/source.py",
        '            threads="auto" if self.threads == "auto" else None,',
        "            threads=None,",
        _vc + "::test_threads_auto_decodes_four_videos_at_once_in_their_order",
    ),
]
MUTANTS += [
    _m(
        "a threaded map holds one item a thread (the consumer's work stalls every thread)",
        "streambuf/_lanes.py",
        "ITEMS_PER_THREAD = 2\n",
        "ITEMS_PER_THREAD = 1\n",
        "tests/test_prefetch.py::test_a_threaded_map_holds_two_items_a_thread_while_the_consumer_works",
    ),
]
# the noise margin (2026-12-04) and inline as the tuner's count 0
MUTANTS += [
    _m(
        "the windows' noise is taken as 0 (every window's rate as exact)",
        "streambuf/_tuner.py",
        "        return math.sqrt(sum(d * d for d in spreads) / len(spreads)) if spreads else 0.0",
        "        return 0.0",
        "::test_the_noise_of_a_loaded_machine_is_measured",
        "::test_on_a_noisy_machine_the_count_does_not_walk_down",
    ),
    _m(
        "contended, fewer threads are taken when one window of them reads as much",
        "streambuf/_tuner.py",
        "                same = (self.SAME + self.noise) * self._rates[self._from]",
        "                same = self.SAME * self._rates[self._from]",
        "::test_on_a_noisy_machine_the_count_stays_where_it_pays",
    ),
    _m(
        "a step up is kept when it paid by the noise alone",
        "streambuf/_tuner.py",
        "            if rate >= (1.0 + max((self.gain - 1.0) * step, self.noise)) * prev:",
        "            if rate >= (1.0 + (self.gain - 1.0) * step) * prev:",
        "::test_on_a_noisy_machine_a_plateau_does_not_climb",
    ),
    _m(
        "a window's halves are split at its first burst (one half empty: no noise)",
        "streambuf/_tuner.py",
        "        _, t_mid, made_mid = min(list(starts)[1:], key=lambda e: abs(e[1] - middle))",
        "        _, t_mid, made_mid = starts[0]",
        "::test_the_noise_of_a_loaded_machine_is_measured",
    ),
    _m(
        "the tuner never goes below one thread (inline is never tried)",
        "streambuf/_tuner.py",
        "        self.least = 0 if inline else 1",
        "        self.least = 1",
        "::test_a_gil_bound_function_runs_inline_where_that_is_fastest",
    ),
    _m(
        "going inline does not wait for the threads' items to be delivered (order lost)",
        "streambuf/prefetch.py",
        '                if chooser.state == "drain" and self._all_delivered():',
        '                if chooser.state == "drain":',
        "::test_order_and_exactly_once_while_the_stage_goes_inline_and_back[True]",
    ),
    _m(
        "coming back from inline leaves the producers paused (a hang)",
        "streambuf/prefetch.py",
        '            self.inline, self.state = False, "threads"\n            return "resume"',
        '            self.inline, self.state = False, "threads"\n            return "none"',
        "::test_order_and_exactly_once_while_the_stage_goes_inline_and_back[True]",
    ),
    _m(
        "a follower does not follow its leader inline (it climbs alone)",
        "streambuf/stages.py",
        "        return int(threads) if threads > 0 else (0 if inline > 0 else None)",
        "        return int(threads) if threads > 0 else None",
        "::test_loader_workers_follow_worker_0_inline",
    ),
    _m(
        "a worker running inline is shown as stopped",
        "streambuf/_counters.py",
        '            "running": (count != 0) - was,',
        '            "running": (count > 0) - (shown[0] > 0),',
        "::test_loader_workers_follow_worker_0_inline",
    ),
    _m(
        "a worker's count changes are not counted (stats().threads shows 0 changes)",
        "streambuf/_counters.py",
        '            "changes": int(was and count != 0 and count != shown[0]),',
        '            "changes": 0,',
        "::test_loader_workers_report_their_counts",
    ),
]
MUTANTS += [
    _m(
        "contended, a count taken away by a noisy window never comes back",
        "streambuf/_tuner.py",
        "            new = min(new, self._high)",
        "            return None",
        "::test_contended_a_count_taken_away_comes_back",
        "::test_on_a_noisy_machine_the_count_stays_where_it_pays",
    ),
]
MUTANTS += [
    _m(
        "a re-check from a count capped by the byte room halves it (never measures 16 again)",
        "streambuf/_tuner.py",
        "        new = max(self.least, 1 << (count.bit_length() - 1) if count > 1 else 0)",
        "        new = max(self.least, count // 2)",
        "::test_a_recheck_from_a_capped_count_measures_the_count_below_it",
    ),
    _m(
        "at the byte room a count that pays nothing more than fewer threads is kept",
        "streambuf/_tuner.py",
        "        if count >= self._room_cap() and count > 1:",
        "        if False:",
        "::test_at_the_byte_room_a_count_that_pays_nothing_more_is_not_kept",
    ),
    _m(
        "at the byte room fewer threads are taken though they did less",
        "streambuf/_tuner.py",
        "            fewer = [c for c, r in self._rates.items() if c < count and r >= floor]",
        "            fewer = [c for c, r in self._rates.items() if c < count]",
        "::test_at_the_byte_room_a_count_that_pays_is_kept",
    ),
]
MUTANTS += [
    _m(
        "a check whose first step up fails halves the count it began at (21 -> 10)",
        "streambuf/_tuner.py",
        "            new = self._below(self._from)",
        "            new = max(self.least, self._from // 2)",
        "::test_a_check_whose_first_step_up_fails_looks_down_on_the_grid",
    ),
]
MUTANTS += [
    _m(
        "the controller ignores its threads' wait for cores",
        "streambuf/_tuner.py",
        "        self.contended = (needs_core >= self.computes and self.waited >= self.core_wait) or (",
        "        self.contended = False or (",
        "::test_stops_growing_where_its_threads_wait_for_cores",
        "::test_a_computing_stage_on_a_busy_machine_does_not_grow",
    ),
    _m(
        "the controller ignores a function that holds the GIL",
        "streambuf/_tuner.py",
        "            _GIL and self.gil_cores <= self.cores <= GIL_MAX_CORES and needs_core < self.gil_share",
        "            False",
        "::test_a_stage_that_holds_the_gil_does_not_grow",
    ),
    _m(
        "a stage that keeps several CPUs busy is taken for one holding the GIL",
        "streambuf/_tuner.py",
        "self.gil_cores <= self.cores <= GIL_MAX_CORES and",
        "self.gil_cores <= self.cores and",
        "::test_a_decode_that_releases_the_gil_on_free_cores_grows",
    ),
    _m(
        "a waiting stage is taken for a contended one (the busy machine stops it)",
        "streambuf/_tuner.py",
        "        self.contended = (needs_core >= self.computes and self.waited >= self.core_wait) or (",
        "        self.contended = (self.waited >= self.core_wait) or (",
        "::test_a_waiting_stage_grows_however_busy_other_processes_keep_the_machine",
    ),
    _m(
        "the CPUs a stage keeps busy are not scaled from its sampled calls to all",
        "streambuf/_tuner.py",
        "        self.cores = cpu * (calls / sampled) / max(dt, 1e-9)",
        "        self.cores = cpu / max(dt, 1e-9)",
        "::test_a_stage_that_holds_the_gil_does_not_grow",
    ),
    _m(
        "the call cost forgets the calls it did not sample",
        "streambuf/_cost.py",
        "        cell[0] = n + 1\n",
        "        pass\n",
        "::test_the_call_cost_counts_every_call_and_times_a_sample",
    ),
    _m(
        "a threaded map's tuner gets no cost signal",
        "streambuf/prefetch.py",
        "                cost=self._cost.totals if self._cost is not None else None,",
        "                cost=None,",
        "::test_a_threaded_map_measures_what_its_calls_cost",
    ),
    _m(
        "the source lanes' tuner gets no cost signal",
        "streambuf/_source.py",
        "                cost=self._cost.totals,",
        "                cost=None,",
        "tests/sources/test_lane_threads.py::test_the_tuner_keeps_a_thread_per_lane_where_every_lane_waits",
    ),
]
