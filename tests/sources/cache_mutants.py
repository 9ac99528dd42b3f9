"""The shard cache's planted bugs, for ``tests/mutants.py`` (to merge into its
``MUTANTS``; until then: ``python tests/sources/cache_mutants.py [NAME...]``). Each one
must make the cache test named beside it fail."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.mutants import Mutant, run_one

T = "tests/sources/test_cache.py"
C = "streambuf/sources/cache.py"
MUTANTS = [
    Mutant(
        "reservation ignores the limit",
        C,
        "if _used(m) + size <= self.limit:\n            return True\n        self._drop_stale(m)",
        "if True:\n            return True\n        self._drop_stale(m)",
        (f"{T}::test_half_limit_halves_requests_and_the_folder_never_exceeds_it",),
    ),
    Mutant(
        "bound ignores reservations in flight",
        C,
        """+ sum(
        int(r["size"]) for r in m["reserved"].values()
    )""",
        """+ 0 * sum(
        int(r["size"]) for r in m["reserved"].values()
    )""",
        (f"{T}::test_half_limit_halves_requests_and_the_folder_never_exceeds_it",),
    ),
    Mutant(
        "eviction trades the data set's own entries",
        C,
        '(k for k in m["entries"] if k not in self._keep)',
        '(k for k in m["entries"])',
        (f"{T}::test_half_limit_halves_requests_and_the_folder_never_exceeds_it",),
    ),
    Mutant(
        "hits not verified at all",
        C,
        "why, checked = _damage(fd, st, rec)",
        "why, checked = None, None",
        (f"{T}::test_damaged_entry_is_fetched_again",),
    ),
    Mutant(
        "crc32 not checked",
        C,
        '    if crc != int(rec["crc32"]):',
        "    if False:",
        (f"{T}::test_damaged_entry_is_fetched_again",),
    ),
    Mutant(
        "an entry in use is evicted",
        C,
        """                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:  # in use by a reader""",
        """                try:
                    pass
                except OSError:  # in use by a reader""",
        (f"{T}::test_an_entry_in_use_is_not_evicted",),
    ),
    Mutant(
        "no writer lock per key",
        C,
        """            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # another process (or lane) is writing this key""",
        """            pass
        except OSError:  # another process (or lane) is writing this key""",
        (f"{T}::test_a_key_being_written_elsewhere_streams_without_writing",),
    ),
    Mutant(
        "commit replaces a file at the entry's path",
        C,
        "if final.exists():  # not ours",
        "if False:  # not ours",
        (f"{T}::test_a_file_at_an_entrys_path_is_not_replaced",),
    ),
    Mutant(
        "dead writers are never swept",
        C,
        "        self._drop_stale(m)\n        need",
        "        need",
        (f"{T}::test_a_dead_writers_reservation_is_swept",),
    ),
    Mutant(
        "most recently used goes first",
        C,
        'key=lambda k: (m["entries"][k].get("used", 0), k)',
        'key=lambda k: (-m["entries"][k].get("used", 0), k)',
        (f"{T}::test_eviction_takes_least_recently_used_of_other_data_sets_and_spares_the_rest",),
    ),
    Mutant(
        "a forked child keeps the locks",
        C,
        "            os.dup2(null, fd)",
        "            pass",
        (f"{T}::test_a_forked_child_does_not_keep_the_cache_locks",),
    ),
    Mutant(
        "close never drains the tail",
        C,
        "if w.active and not self._aborted and 0 < left <= _DRAIN_BYTES:",
        "if False:",
        (f"{T}::test_reads_at_an_offset_and_cut_short_reads_make_no_entry",),
    ),
    Mutant(
        "manifest file names not checked",
        C,
        '            and _ENTRY_FILE.fullmatch(e["file"])\n',
        "",
        (f"{T}::test_a_manifest_naming_paths_outside_the_cache_is_refused",),
    ),
    Mutant(
        "local files cached too",
        "streambuf/sources/access.py",
        "if self.cache is None or not is_cacheable(url):",
        "if self.cache is None:",
        (f"{T}::test_local_shards_are_never_cached",),
    ),
    Mutant(
        "resume opens not served from the cache",
        "streambuf/sources/access.py",
        "        if self.cache is None or not is_cacheable(url):\n            return remote(offset, length)",
        "        if self.cache is None or not is_cacheable(url) or offset:\n            return remote(offset, length)",
        (f"{T}::test_resume_reads_cursors_and_pending_samples_from_the_cache",),
    ),
]
MUTANTS.append(
    Mutant(
        "a crc check survives a reboot",
        C,
        '(_BOOT and rec.get("checked") == [_BOOT, *ident])',
        '(rec.get("checked") is not None)',
        (f"{T}::test_one_crc_check_serves_every_process_until_a_reboot",),
    )
)


def main(names: list[str]) -> int:
    chosen = [m for m in MUTANTS if not names or any(n in m.name for n in names)]
    killed = 0
    for m in chosen:
        verdict, took = run_one(m)
        killed += verdict == "killed"
        print(f"{verdict:>8}  {took:5.1f} s  {m.name}", flush=True)
    print(f"{killed} of {len(chosen)} mutants killed")
    return 0 if killed == len(chosen) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
