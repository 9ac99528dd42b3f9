"""The shard cache's planted bugs: ``tests/planted`` gathers them with the others (``make
mutants``; ``python tests/mutants.py cache`` for these alone, by name). Each one must make
the cache test named beside it fail."""

from __future__ import annotations

from tests.planted._mutant import planted

T = "tests/sources/test_cache.py"
C = "streambuf/io/cache.py"
M = "streambuf/io/_manifest.py"
IO = "streambuf/io/_cache_io.py"
A = "streambuf/sources/access.py"
HALF = f"{T}::test_half_limit_halves_requests_and_the_folder_never_exceeds_it"


_m = planted("cache", default_file=T)


MUTANTS = [
    _m(
        "reservation ignores the limit",
        M,
        "    if used_bytes(m) + size <= limit:\n        return 0",
        "    if True:\n        return 0",
        HALF,
    ),
    _m(
        "bound ignores reservations in flight",
        M,
        'int(r["size"]) for r in m["reserved"].values()',
        '0 * int(r["size"]) for r in m["reserved"].values()',
        HALF,
    ),
    _m(
        "eviction trades the data set's own entries",
        M,
        '(k for k in m["entries"] if k not in keep)',
        '(k for k in m["entries"])',
        HALF,
    ),
    _m(
        "hits not verified at all",
        C,
        "why, checked = damage(fd, st, rec)",
        "why, checked = None, None",
        "test_damaged_entry_is_fetched_again",
    ),
    _m(
        "crc32 not checked",
        IO,
        '    if crc != int(rec["crc32"]):',
        "    if False:",
        "test_damaged_entry_is_fetched_again",
    ),
    _m(
        "an entry in use is evicted",
        M,
        "                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
        "            except OSError:  # in use by a reader",
        "                pass\n            except OSError:  # in use by a reader",
        "test_an_entry_in_use_is_not_evicted",
    ),
    _m(
        "no writer lock per key",
        C,
        "            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
        "        except OSError:  # another process (or lane) is writing this key",
        "            pass\n        except OSError:  # another process (or lane) is writing this key",
        "test_a_key_being_written_elsewhere_streams_without_writing",
    ),
    _m(
        "commit replaces a file at the entry's path",
        C,
        "                if final.exists():\n                    dead =",
        "                if False:\n                    dead =",
        "test_a_file_at_an_entrys_path_is_not_replaced",
    ),
    _m(
        "dead writers are never swept",
        M,
        '        if writer_alive(r["key"]):\n            continue',
        "        if True:\n            continue",
        "test_a_dead_writers_reservation_is_swept",
    ),
    _m(
        "most recently used goes first",
        M,
        'key=lambda k: (m["entries"][k].get("used", 0), k)',
        'key=lambda k: (-m["entries"][k].get("used", 0), k)',
        "test_eviction_takes_least_recently_used_of_other_data_sets_and_spares_the_rest",
    ),
    _m(
        "a forked child keeps the locks",
        IO,
        "            os.dup2(null, fd)",
        "            pass",
        "test_a_forked_child_does_not_keep_the_cache_locks",
    ),
    _m(
        "the tail is not received early",
        IO,
        "if w.active and not self._aborted and 0 < w.size - self._inner.offset <= DRAIN_BYTES:",
        "if False:",
        "test_reads_at_an_offset_and_cut_short_reads_make_no_entry",
    ),
    _m(
        "manifest file names not checked",
        M,
        '            and _ENTRY_FILE.fullmatch(e["file"])\n',
        "",
        "test_a_manifest_naming_paths_outside_the_cache_is_refused",
    ),
    _m(
        "a crc check survives a reboot",
        IO,
        '(BOOT and rec.get("checked") == [BOOT, *version])',
        '(rec.get("checked") is not None)',
        "test_one_crc_check_serves_every_process_until_a_reboot",
    ),
    _m(
        "a write error fails the read",
        IO,
        "        except OSError as exc:  # disk full, ...: keep streaming, without the entry\n"
        '            self._warn("write", f"cannot write the cache\'s temp file {self.tmp}: {exc}")\n'
        "            self.discard()\n            return",
        "        except ZeroDivisionError:\n            return",
        "test_a_failing_disk_never_fails_the_read",
    ),
    _m(
        "local files cached too",
        A,
        "if self.cache is None or not is_cacheable(url):",
        "if self.cache is None:",
        "test_local_shards_are_never_cached",
    ),
    _m(
        "resume opens not served from the cache",
        A,
        "        if self.cache is None or not is_cacheable(url):\n            return remote(offset, length)",
        "        if self.cache is None or not is_cacheable(url) or offset:\n"
        "            return remote(offset, length)",
        "test_resume_reads_cursors_and_pending_samples_from_the_cache",
    ),
    _m(
        "remote videos not cached",
        "streambuf/video/source.py",
        "    if cache_dir is not None and cache_limit is not None:",
        "    if False:",
        "tests/video/test_clips_pipeline.py::test_remote_videos_are_cached_on_the_node",
    ),
    _m(
        "a cache lock found stuck is waited for again at every open",
        "streambuf/io/_manifest.py",
        "            deadline = time.monotonic() + (STUCK_POLL_S if self._stuck else LOCK_TIMEOUT_S)",
        "            deadline = time.monotonic() + LOCK_TIMEOUT_S",
        "tests/sources/test_cache.py::test_a_lock_held_by_a_hung_process_is_waited_for_once",
    ),
    _m(
        "a commit whose manifest write failed leaves its file in data/",
        "streambuf/io/cache.py",
        "            if renamed:  # the manifest was not written: no record names the file",
        "            if False:",
        "tests/sources/test_cache.py::"
        "test_a_manifest_write_failing_after_the_rename_leaves_no_orphan",
    ),
    _m(
        "a dead writer's file at an entry's path blocks the key for good",
        "streambuf/io/cache.py",
        "                    if not dead or any(",
        "                    if True or any(",
        "tests/sources/test_cache.py::test_a_dead_writers_file_at_the_entrys_path_is_replaced",
    ),
]
