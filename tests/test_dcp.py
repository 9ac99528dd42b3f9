"""torch.distributed.checkpoint (DCP) round trips of a Loader on real gloo ranks: 2 ranks
save mid-epoch through ``DistributedState``; 2 ranks load and finish exactly as the
uninterrupted run; one process loads the same checkpoint and finishes the epoch with
every sample once (elastic)."""

from __future__ import annotations

import json
import multiprocessing as mp
import socket
from typing import Any

import pytest

import streambuf as sb
from tests.pipeline_data import all_samples
from tests.resume_data import N_SHARDS, plain_loader
from tests.resume_harness import counted_once, ids_of

pytestmark = pytest.mark.timeout(240)

dcp = pytest.importorskip("torch.distributed.checkpoint")

STOP = 2  # batches each rank takes before the checkpoint


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


MODES = ("save", "load", "naive-save", "naive-load", "dup", "disagree")  # in this order
PATHS = {
    "save": "ckpt",
    "load": "ckpt",
    "naive-save": "naive",
    "naive-load": "naive",
    "dup": "dup",
    "disagree": "-",
}


def _two(shard: str) -> Any:
    """Two samples of a shard (``expand``: the items are shard names)."""
    yield f"{shard}/0"
    yield f"{shard}/1"


def _disagree() -> tuple[list, list | None]:
    """Ranks whose loaders agree pass ``check_ranks``; each compared field (a seed, a
    shard order, a worker count, equalize) and each source kind's identity (named
    shards, plain items, token files, a mix's sources) that differs on rank 1 is
    refused on every rank, by ``check_ranks`` and by
    ``DistributedState``'s save (each rank split the data by its own values: samples
    lost and repeated, without any other sign)."""
    import torch.distributed as dist

    rank = dist.get_rank()
    names = [f"shard-{k}.tar" for k in range(6)]

    def loader(seed: int = 0, order=names, workers: int = 0, equalize=None) -> sb.Loader:
        pipe = sb.Pipeline(
            list(order),
            expand=_two,
            shuffle_shards=True,
            seed=seed,
            equalize=equalize,
            samples_per_shard=2,
        )
        pipe = pipe.batch(2, collate=list)
        return sb.Loader(pipe, num_workers=workers, max_batches=2, max_bytes="1MiB")

    seen = []
    sb.check_ranks(loader())
    # what a rank may set for itself: a stage's config, an unshuffled pipeline's seed
    own = sb.Pipeline(names, expand=_two, seed=rank).map(repr if rank else str)
    own = own.batch(2, collate=list)
    sb.check_ranks(sb.Loader(own, num_workers=0, max_batches=2, max_bytes="1MiB"))
    seen.append("agree")
    for what, kw in (
        ("seed", {"seed": rank}),
        ("shard list", {"order": names[::-1] if rank else names}),
        ("num_workers", {"workers": rank}),
        ("equalize", {"equalize": "drop" if rank else None}),
    ):
        try:
            sb.check_ranks(loader(**kw))
            seen.append(f"{what}: passed")
        except ValueError as exc:
            seen.append(f"{what}: {exc}")
    # every source kind's identity: token files and a mix's sources, listed in another
    # order on rank 1 (each lists the same data: the order alone splits it otherwise)
    import tempfile

    import numpy as np

    folder = tempfile.mkdtemp(prefix=f"streambuf-ranks-{rank}-")
    files = []
    for k, n in enumerate((64, 96, 128)):
        path = f"{folder}/tokens-{k}.bin"
        np.arange(n, dtype=np.uint16).tofile(path)
        files.append(path)

    def token_loader(order) -> sb.Loader:
        pipe = sb.token_files(order, seq_len=8, seed=0).batch(2)
        return sb.Loader(pipe, num_workers=0, max_batches=2, max_bytes="1MiB")

    def mix_loader(first: int) -> sb.Loader:
        a = sb.Pipeline(names[:3], expand=_two)
        b = sb.Pipeline(names[3:], expand=_two)
        pipes = [a, b] if first == 0 else [b, a]
        pipe = sb.mix(pipes, weights=[1, 1]).batch(2, collate=list)
        return sb.Loader(pipe, num_workers=0, max_batches=2, max_bytes="1MiB")

    def items_loader(count: int) -> sb.Loader:
        pipe = sb.Pipeline(list(range(count)), shuffle_shards=True).batch(2, collate=list)
        return sb.Loader(pipe, num_workers=0, max_batches=2, max_bytes="1MiB")

    for what, make in (
        ("items count", lambda: items_loader(12 if rank else 10)),
        ("token_files order", lambda: token_loader(files[::-1] if rank else files)),
        ("mix source order", lambda: mix_loader(rank)),
    ):
        try:
            sb.check_ranks(make())
            seen.append(f"{what}: passed")
        except ValueError as exc:
            seen.append(f"{what}: {exc}")
    sb.check_ranks(token_loader(files))  # the same files in each rank's own folder agree
    differing = loader(seed=rank)
    try:
        sb.DistributedState(differing).state_dict()
        seen.append("save: passed")
    except ValueError as exc:
        seen.append(f"save: {exc}")
    return seen, None


def _mode(mode: str, path: str) -> tuple[list, list | None]:
    """One rank's part of ``mode`` (in a process group): what it saw."""
    loader = plain_loader(workers=2)  # rank and world from torch.distributed
    if mode == "dup":  # both ranks read the same data (one data-parallel rank)
        same = plain_loader(workers=2, rank=0, world=1)
        it = iter(same)
        for _ in range(STOP):
            next(it)
        text = sb.DistributedState(same).state_dict()["streambuf_states"]
        del it
        return [len(json.loads(text))], None
    if mode == "disagree":
        return _disagree()
    if mode == "naive-save":  # the loader itself under one key: per-rank values
        for i, _ in enumerate(loader):
            if i == STOP - 1:
                dcp.save({"loader": loader}, checkpoint_id=path)
        return [], None
    if mode == "naive-load":
        try:
            dcp.load({"loader": loader}, checkpoint_id=path)
            return ["loaded"], None
        except BaseException as exc:  # DCP raises CheckpointException, a BaseException
            return [f"{type(exc).__name__}: {exc}"], None
    if mode == "save":
        ids, whole = [], []
        for i, batch in enumerate(loader):
            (ids if i < STOP else whole).append(ids_of(batch))
            if i == STOP - 1:  # STOP batches received: the state says so
                dcp.save({"loader": sb.DistributedState(loader)}, checkpoint_id=path)
        return ids, whole  # whole: the uninterrupted run's rest
    dcp.load({"loader": sb.DistributedState(loader)}, checkpoint_id=path)
    return [ids_of(b) for b in loader], None


def _rank(rank: int, world: int, port: int, root: str, out) -> None:
    """Every mode in turn, in one process group (one spawn for all the DCP tests);
    each result is put as ``(mode, rank, seen, whole)``, an error as its repr."""
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        for mode in MODES:
            path = f"{root}/{PATHS[mode]}"
            try:
                seen, whole = _mode(mode, path)
            except BaseException as exc:  # report instead of leaving the parent waiting
                out.put((mode, rank, repr(exc), None))
                raise
            out.put((mode, rank, seen, whole))
            dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """``mode -> [(rank, seen, whole)]`` of 2 spawned gloo ranks running every mode, and
    ``"root"``: the folder of their checkpoints."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port, root = _free_port(), tmp_path_factory.mktemp("dcp")
    world = 2
    procs = [ctx.Process(target=_rank, args=(r, world, port, str(root), out)) for r in range(world)]
    for p in procs:
        p.start()
    got: dict[str, list[tuple]] = {m: [] for m in MODES}
    try:
        for _ in range(world * len(MODES)):
            mode, rank, seen, whole = out.get(timeout=180)
            got[mode].append((rank, seen, whole))
            if not isinstance(seen, list):
                break  # a rank failed: the rest will not come
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    return {"root": root, **{m: sorted(r, key=lambda x: x[0]) for m, r in got.items()}}


def _results(runs: dict[str, Any], mode: str) -> list[tuple]:
    got = runs[mode]
    assert len(got) == 2 and all(isinstance(r[1], list) for r in got), (mode, runs)
    return got


def test_dcp_round_trip_on_two_gloo_ranks_exact_then_elastic(runs: dict[str, Any]) -> None:
    """Saved by 2 ranks mid-epoch (the save is taken after STOP batches, while the
    loaders run on); loaded by 2 ranks: each rank's rest equals its uninterrupted rest,
    batch for batch. Loaded by one process: the epoch's remaining samples exactly once."""
    saved, resumed = _results(runs, "save"), _results(runs, "load")
    first = [x for _, ids, _ in saved for b in ids for x in b]
    for (rank, _, whole), (_, rest, _) in zip(saved, resumed):
        assert rest == whole, f"rank {rank}: the resumed rest differs from the uninterrupted one"
        assert rest, "the checkpoint was taken mid-epoch"
    counted_once(
        first + [x for _, rest, _ in resumed for b in rest for x in b], all_samples(N_SHARDS)
    )

    # elastic: one process (no process group) loads the 2 ranks' checkpoint
    loader = plain_loader(workers=2)
    dcp.load({"loader": sb.DistributedState(loader)}, checkpoint_id=str(runs["root"] / "ckpt"))
    rest = [x for b in loader for x in ids_of(b)]
    counted_once(first + rest, all_samples(N_SHARDS))


def test_distributed_state_alone_and_bad_values() -> None:
    """Without a process group the value holds this process's state; a wrong value is
    refused with a message naming what was expected."""
    loader = plain_loader(workers=0)
    it = iter(loader)
    first = [x for _ in range(STOP) for x in ids_of(next(it))]
    value = sb.DistributedState(loader).state_dict()
    del it
    again = plain_loader(workers=0)
    sb.DistributedState(again).load_state_dict(value)
    counted_once(first + [x for b in again for x in ids_of(b)], all_samples(N_SHARDS))
    with pytest.raises(ValueError, match="streambuf_states"):
        sb.DistributedState(again).load_state_dict(loader.state_dict())
    with pytest.raises(ValueError, match="not the JSON"):
        sb.DistributedState(again).load_state_dict({"streambuf_states": "{"})


def test_loader_itself_under_dcp_is_refused_not_mixed(runs: dict[str, Any]) -> None:
    """``dcp.save({"loader": loader})`` on 2 ranks: DCP keeps one copy of each leaf of
    the per-rank states; loading it back into fresh loaders, no rank resumes silently:
    DCP itself refuses the fresh loader's template (its ``workers`` leaves differ from
    the saved ones), and a state assembled from both ranks fails its digest (the test
    below)."""
    _results(runs, "naive-save")
    got = [msgs[0] for _, msgs, _ in _results(runs, "naive-load")]
    assert all(m != "loaded" for m in got), got
    assert all("Exception" in m.split(":")[0] or "DistributedState" in m for m in got), got


def test_state_assembled_from_two_ranks_is_refused() -> None:
    """The class of fault behind the DCP pitfall, in process: fields of rank 0's state
    with rank 1's worker snapshots (or any edited field) fail the digest."""
    from tests.resume_harness import save_after

    states = [
        save_after(plain_loader, {"workers": 2, "rank": r, "world": 2}, STOP)[1] for r in range(2)
    ]
    mixed = {**states[0], "workers": states[1]["workers"]}
    loader = plain_loader(workers=2, rank=0, world=2)
    with pytest.raises(ValueError, match="DistributedState"):
        loader.load_state_dict(mixed)
    with pytest.raises(ValueError, match="digest: a value in it was changed after"):
        loader.load_state_dict({**states[0], "next_worker": 1 - states[0]["next_worker"]})
    loader.load_state_dict(states[0])  # the state as saved loads
    old = {k: v for k, v in states[0].items() if k != "digest"}
    plain_loader(workers=2, rank=0, world=2).load_state_dict(old)  # saved before digests


def test_state_digest_survives_json_with_int_keyed_user_state() -> None:
    """A user stage's state with int keys and tuples (not JSON as such): the digest
    is taken over the form JSON brings back, so a DistributedState round trip loads."""
    from streambuf._state import digest, with_digest

    state = {"kind": "x", "workers": [{"stages": {"0": {2: (1, 2), 10: [3]}}}], "epoch": 0}
    signed = with_digest(dict(state))
    import json as _json

    back = _json.loads(_json.dumps(signed))
    assert digest(back) == signed["digest"]
    assert digest({"workers": [object()]}) is not None  # unhashable parts by repr


def test_ranks_of_one_data_rank_give_one_state(runs: dict[str, Any]) -> None:
    """Two ranks holding the same data rank (tensor parallelism within a replica): the
    gathered value keeps one state for it (a list of two rank-0 states would be refused
    as an incomplete set of ranks)."""
    got = _results(runs, "dup")
    assert [n for _, (n,), _ in got] == [1, 1]


def _canonical_reference(v: object) -> object:
    """The digest's canonical form, element by element (what ``_canonical``'s fast paths
    must give: a digest that changed would refuse every state saved before)."""
    if isinstance(v, dict):
        items = sorted(v.items(), key=lambda kv: str(kv[0]))
        return [[str(k), _canonical_reference(x)] for k, x in items]
    if isinstance(v, list | tuple):
        return [_canonical_reference(x) for x in v]
    if v is None or isinstance(v, bool | int | float | str):
        return v
    return repr(v)


def test_the_digest_form_is_the_element_by_element_one() -> None:
    import enum
    import random

    from streambuf._state import _canonical

    class Level(enum.IntEnum):
        HIGH = 1

    rnd = random.Random(0)
    leaves = [lambda: rnd.randrange(-5, 5), rnd.random, lambda: "s", lambda: None, lambda: True]
    leaves += [lambda: Level.HIGH, lambda: {1, 2}]

    def make(depth: int) -> object:
        kind = rnd.randrange(10 if depth < 4 else len(leaves))
        if kind < len(leaves):
            return leaves[kind]()
        if kind == len(leaves):
            return [make(depth + 1) for _ in range(rnd.randrange(4))]
        if kind == len(leaves) + 1:
            return (make(depth + 1), rnd.randrange(3), [0, rnd.randrange(9)])
        return {rnd.choice([1, "a", 2, "b", (1, 2)]): make(depth + 1) for _ in range(3)}

    for _ in range(2000):
        state = make(0)
        assert _canonical(state) == _canonical_reference(state), state
    pending = [[7, 1, [1024, 2048]], [3, 0, (0, 1024)], [Level.HIGH, 2, [0, 1]]]
    assert _canonical(pending) == _canonical_reference(pending)


def test_ranks_that_split_the_data_differently_are_refused(runs: dict[str, Any]) -> None:
    for rank, seen, _ in _results(runs, "disagree"):
        assert seen[0] == "agree", (rank, seen)
        assert "disagree on seed (shuffle_shards) (rank 0: 0, rank 1: 1)" in seen[1], (rank, seen)
        assert "disagree on shard list" in seen[2], (rank, seen)
        assert "disagree on num_workers (rank 0: 0, rank 1: 1)" in seen[3], (rank, seen)
        assert "disagree on equalize" in seen[4], (rank, seen)
        assert "disagree on shard list" in seen[5], (rank, seen)  # plain items, a count
        assert "disagree on shard list" in seen[6], (rank, seen)  # token_files order
        assert "disagree on shard list" in seen[7], (rank, seen)  # a mix's source order
        assert "lost and repeated" in seen[8] and "pin a number" in seen[8], (rank, seen)
