"""Multi-turn work: a first request and its revisions, every mode on the same history.

Laptop work repeats itself: a first request is followed by revisions ("now add type hints and show the
whole file"), and an editor or agent re-sends a growing file. Each conversation in a JSONL file (``id``,
``kind``, ``turns``: the user's messages; the default is ``bench/conversations.jsonl``) runs its turns
in order with the real history: the chat so far, the user's messages and plain decoding's earlier
replies. For each turn every mode answers the same history, greedy, back to back in the order of one
row of a Williams design (``bench.run.balanced_order``; the row moves on every turn, so the order
changes from turn to turn and conversation to conversation), and greedy auto mode must write plain
decoding's text (a difference is reported, with the target's top-two gap where it happens). The KV
caches are kept from request to request as a chat keeps them (a request reuses what it shares with
the last one) and emptied at each conversation's start; decode speed does not include prompt
processing.

Modes: ``plain``, ``auto`` and ``auto-history``: auto mode with the history drafter, which keeps what
the user wrote in a folder (``LoadSettings.history_dir``) and learns each request's prompt and reply
under its conversation (``GenerationSettings.history_doc``). ``auto-history`` runs only on an engine
with those fields, on a second load of the pair (auto mode drafts from a history whenever its pair
keeps one, so plain and auto run on a pair loaded without one); both loads plan with one cost model.
Every repeat then runs two passes on a new history folder: the first learns the history as the
workload goes (a turn can draw on the turns and conversations before it); then the pairs are closed
and loaded again, the history from the same folder, and the second pass runs the whole workload again
with everything the first one learned::

    python -m bench.multiturn --target T.gguf --draft D.gguf --repeats 2

Prints, per pass and mode, decode tokens/s and the speedup over plain for first turns and for revision
turns apart (pooled, and the median with quartiles and range over turns), acceptance and tokens per
round, and writes JSON (``--out``) that ``python -m bench.replay`` reads: its plain replies carry the
chat they answered, and its categories are ``first`` and ``revision``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.busy import BUSY_CORES, BUSY_WINDOW, QUIET_CORES, BusyWatch, OthersCpu, wait_quiet
from bench.modes import MODES, Mode, collect, parse_modes, reply_record, warm_up
from bench.multiturn_report import (
    best_fixed_lines,
    history_timing_line,
    markdown_table,
    second_pass_check,
    summarize,
)
from bench.run import REPO, balanced_order, lookup_bound, machine, recorded_ratios

DEFAULT_CONVERSATIONS = Path(__file__).with_name("conversations.jsonl")
KINDS = ("code", "document", "agent")
HISTORY_READY_TIMEOUT = 600.0  # seconds to wait for a loaded history (it loads in the background)
RETRY_WAIT = 600.0  # seconds: at most this long waiting for a quiet machine before a turn runs again


DEFAULT_MODES = "plain,auto,auto-history"


def history_supported() -> bool:
    """Whether the engine takes a history folder at load and a document per request."""
    from app.engine.settings import GenerationSettings, LoadSettings

    load = {f.name for f in dataclasses.fields(LoadSettings)}
    gen = {f.name for f in dataclasses.fields(GenerationSettings)}
    return "history_dir" in load and "history_doc" in gen


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", required=True, help="target GGUF")
    p.add_argument("--draft", help="draft GGUF (used by auto mode)")
    p.add_argument("--conversations", type=Path, default=DEFAULT_CONVERSATIONS, help="JSONL: id, kind, turns")
    p.add_argument(
        "--modes",
        default=DEFAULT_MODES,
        help=f"comma-separated, from: {', '.join(MODES)}; spec: spec1-4,6,8 (fixed settings: auto is held to "
        "the best of them per group)",
    )
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--ctx", type=int, default=8192)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--gpu-layers", default="auto", metavar="auto|all|cpu|N", help="as tandem generate's")
    p.add_argument("--repeats", type=int, default=1, help="run the whole workload this many times")
    p.add_argument("--limit", type=int, default=0, help="only the first N conversations")
    p.add_argument("--kinds", default="", help=f"only these kinds (comma-separated, from {', '.join(KINDS)})")
    p.add_argument("--shift", type=int, default=0, help="start this many rows further into the orders")
    p.add_argument(
        "--wait-quiet",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="before each turn, wait up to this long until other processes use under "
        f"{QUIET_CORES} of a core (a shared machine); each turn records what others used during it",
    )
    p.add_argument(
        "--retry-busy",
        type=int,
        default=0,
        metavar="N",
        help=f"stop a turn as soon as other processes use over {BUSY_CORES} of a core for "
        f"{BUSY_WINDOW:g} s, and run it again once they are quiet (up to N times; the last try is kept)",
    )
    p.add_argument(
        "--history-dir",
        type=Path,
        default=None,
        help="where auto-history keeps its history: a new sub-folder repeat-<r> per repeat (default: a "
        "temporary folder, removed at the end)",
    )
    p.add_argument(
        "--no-second-pass", action="store_true", help="with auto-history, skip the pass on a reloaded history"
    )
    p.add_argument(
        "--timing-tokens",
        type=int,
        default=1_000_000,
        metavar="N",
        help="with auto-history, time the history's calls on an index of N tokens at the end (0: not)",
    )
    p.add_argument(
        "--out", type=Path, default=None, help="results JSON (default bench/results/multiturn-<time>.json)"
    )


def load_conversations(path: Path, limit: int = 0, kinds: str = "") -> list[dict[str, Any]]:
    """The conversations (checked: an id, a known kind, non-empty user turns), in file order."""
    if not path.exists():
        raise SystemExit(f"conversation file not found: {path}")
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as e:
            raise SystemExit(f"{path}:{n}: not JSON: {e}") from None
        turns = row.get("turns") if isinstance(row, dict) else None
        if (
            not isinstance(row.get("id"), str)
            or row.get("kind") not in KINDS
            or not isinstance(turns, list)
            or not turns
            or not all(isinstance(t, str) and t.strip() for t in turns)
        ):
            raise SystemExit(f"{path}:{n}: need an id, a kind ({', '.join(KINDS)}) and a list of turns")
        rows.append(row)
    if len({r["id"] for r in rows}) != len(rows):
        raise SystemExit(f"{path}: conversation ids repeat")
    wanted = {k for k in kinds.split(",") if k}
    if wanted - set(KINDS):
        raise SystemExit(f"unknown kinds: {', '.join(sorted(wanted - set(KINDS)))}")
    rows = [r for r in rows if not wanted or r["kind"] in wanted]
    return rows[:limit] if limit else rows


def history_doc(conversation: str, pass_no: int) -> str:
    """The history's document for a conversation. The second pass writes its own: a conversation's
    document holds its latest version (a first turn recorded again would drop the later turns the
    first pass wrote), and the work done again is a new conversation on a history that holds the
    first pass's."""
    return conversation if pass_no == 1 else f"{conversation} (pass {pass_no})"


def generation_settings(m: Mode, conversation: str, max_tokens: int) -> Any:
    return m.settings(max_tokens, **({"history_doc": conversation} if m.history else {}))


def open_engine(args: argparse.Namespace, history_dir: Path | None = None, costs: Any = None) -> Any:
    """Load the pair (on ``history_dir`` if given; with ``costs``, auto mode's cost model of another
    engine instead of its own) and wait until its history, if any, is loaded."""
    from app.engine.engine import Engine, LoadSettings
    from app.engine.settings import parse_gpu_layers

    extra = {"history_dir": str(history_dir)} if history_dir is not None else {}
    load = LoadSettings(
        target=args.target,
        draft=args.draft,
        n_ctx=args.ctx,
        n_threads=args.threads,
        n_gpu_layers=parse_gpu_layers(args.gpu_layers),
        **extra,
    )
    engine = Engine(load, costs=costs)
    if history_dir is not None:
        deadline = time.monotonic() + HISTORY_READY_TIMEOUT
        while (info := history_info(engine)) is not None and not info.get("ready", True):
            if time.monotonic() > deadline:
                engine.close()
                raise SystemExit(f"the history in {history_dir} did not load in {HISTORY_READY_TIMEOUT:g} s")
            time.sleep(0.2)
    return engine


def open_engines(args: argparse.Namespace, modes: list[Mode], history_dir: Path | None) -> dict[str, Any]:
    """The engine each mode runs on. Plain and auto run on a pair loaded without a history (auto mode
    as it is without one), auto-history on a second load of the pair on ``history_dir`` (auto mode
    drafts from the history whenever the pair keeps one). The second shares the first one's cost
    model, so both auto modes plan with the same measured costs."""
    first = open_engine(args)
    engines = {m.name: first for m in modes if not m.history}
    try:
        if any(m.history for m in modes):
            second = open_engine(args, history_dir, costs=first.costs)
            engines.update({m.name: second for m in modes if m.history})
    except BaseException:
        first.close()
        raise
    return engines


def close_engines(engines: dict[str, Any]) -> None:
    """Close each engine once (closing saves a history)."""
    for e in {id(e): e for e in engines.values()}.values():
        e.close()


def history_info(engine: Any) -> dict[str, Any] | None:
    """The engine's ``history_info()`` as a dict (None where the engine has none)."""
    get = getattr(engine, "history_info", None)
    if get is None:
        return None
    info = get()
    return dataclasses.asdict(info) if dataclasses.is_dataclass(info) else dict(vars(info))


def generate(engine: Any, ids: list[int], gs: Any, cancel: Any = None) -> dict[str, Any]:
    return reply_record(*collect(engine.generate(ids, gs, cancel=cancel)))


def forget_turn(engines: dict[str, Any], modes: list[Mode], conversation: str) -> None:
    """Before a turn runs again: the history must not hold the reply (or the part of it) the stopped
    try wrote. The conversation's document goes whole: its earlier turns are in the prompt, and the
    next reply adds them back; the first pass's documents stay."""
    for m in modes:
        remove = getattr(engines[m.name], "remove_history", None)
        if m.history and remove is not None:
            remove([conversation])


def run_pass(
    engines: dict[str, Any],
    conversations: list[dict[str, Any]],
    modes: list[Mode],
    args: argparse.Namespace,
    *,
    repeat: int,
    pass_no: int,
    label: str,
) -> list[dict[str, Any]]:
    """Every conversation's turns in order, every mode on each turn (on its engine: ``engines[name]``;
    plain decoding's engine renders the chat and checks differences); one record per turn and mode."""
    engine = engines["plain"]
    records: list[dict[str, Any]] = []
    n_turns = sum(len(c["turns"]) for c in conversations)
    row = args.shift + repeat  # each repeat starts one row further, so a turn changes its order
    done = 0
    for conv in conversations:
        doc = history_doc(conv["id"], pass_no)
        for e in {id(e): e for e in engines.values()}.values():
            e.reset()  # a new chat: nothing cached
        messages: list[dict[str, str]] = []
        for t, user in enumerate(conv["turns"]):
            messages.append({"role": "user", "content": user})
            ids = engine.chat_prompt(messages)
            if len(ids) + args.max_tokens > engine.n_ctx:
                raise SystemExit(
                    f"{conv['id']} turn {t + 1}: {len(ids)} prompt tokens and {args.max_tokens} new ones do "
                    f"not fit a context of {engine.n_ctx}: give a larger --ctx"
                )
            order = balanced_order(modes, row)
            row += 1
            for attempt in range(args.retry_busy + 1):
                if args.wait_quiet > 0 or attempt:
                    wait_quiet(max(args.wait_quiet, RETRY_WAIT) if attempt else args.wait_quiet)
                watch = BusyWatch() if attempt < args.retry_busy else None
                others = OthersCpu()
                runs: dict[str, dict[str, Any]] = {}
                for m in order:
                    gs = generation_settings(m, doc, args.max_tokens)
                    runs[m.name] = generate(engines[m.name], ids, gs, cancel=watch)
                    if watch is not None and watch.busy:
                        break
                busy = others.cores()
                if watch is None or not watch.busy:
                    break
                print(
                    f"[{label}] {conv['id']} turn {t + 1}: other processes took the CPU "
                    f"({watch.busy:.1f} cores); the turn runs again",
                    file=sys.stderr,
                    flush=True,
                )
                forget_turn(engines, modes, doc)
            plain = runs["plain"]
            plain["messages"] = [dict(x) for x in messages]  # the chat it answered (for bench.replay)
            plain["lookup_bound"] = lookup_bound(ids, plain["tokens"], engine.costs.ratio)
            for name, r in runs.items():
                compare(engine, ids, plain["tokens"], r, name == "plain")
                records.append(
                    {
                        "id": f"{conv['id']}/{t + 1}",
                        "conversation": conv["id"],
                        "kind": conv["kind"],
                        "turn": t + 1,
                        "category": "first" if t == 0 else "revision",
                        "mode": name,
                        "repeat": repeat,
                        "pass": pass_no,
                        "position": next(j for j, m in enumerate(order) if m.name == name),
                        "others_cpu": busy,  # cores other processes used during the turn's replies
                        "tries": attempt + 1,
                        **({"history_doc": doc} if MODES[name].history else {}),
                        **r,
                    }
                )
            done += 1
            speeds = "  ".join(f"{n}={r['stats']['decode_tokens_per_second']:.1f}" for n, r in runs.items())
            differs = [n for n, r in runs.items() if r["same_as_plain"] is False]
            print(
                f"[{label} {done}/{n_turns}] {conv['id']} turn {t + 1} ({len(ids)} prompt tokens, "
                f"{len(plain['tokens'])} new, others {busy or 0:.2f} cores): {speeds} tok/s"
                + (f"  DIFFERS: {', '.join(differs)}" if differs else ""),
                file=sys.stderr,
                flush=True,
            )
            messages.append({"role": "assistant", "content": plain["text"]})
    return records


def compare(engine: Any, ids: list[int], plain: list[int], r: dict[str, Any], is_plain: bool) -> None:
    """Mark a reply as plain decoding's text or not; where not, where it left it and the target's
    top-two logit gap there (a numerical tie below ``bench.summary.TIE_GAP``)."""
    if is_plain:
        r["same_as_plain"] = None
        return
    r["same_as_plain"] = r["tokens"] == plain
    if not r["same_as_plain"]:
        j = next(
            (j for j, (a, b) in enumerate(zip(plain, r["tokens"], strict=False)) if a != b),
            min(len(plain), len(r["tokens"])),
        )
        r["first_difference"] = j
        r["top2_gap_at_difference"] = engine.top2_gap(ids + plain[:j])


def run(args: argparse.Namespace) -> dict[str, Any]:
    names = [m.name for m in parse_modes(args.modes)]
    if "plain" not in names:
        raise SystemExit("--modes must include plain: its replies are the history every mode answers")
    if args.repeats < 1:
        raise SystemExit("--repeats must be at least 1")
    notes: list[str] = []
    if "auto-history" in names and not history_supported():
        names.remove("auto-history")
        notes.append(
            "auto-history skipped: this engine has no history drafter yet (LoadSettings.history_dir and "
            "GenerationSettings.history_doc do not exist)"
        )
        print(notes[-1], file=sys.stderr)
    modes = [MODES[m] for m in names]
    with_history = any(m.history for m in modes)
    second = with_history and not args.no_second_pass
    conversations = load_conversations(args.conversations, args.limit, args.kinds)
    if not conversations:
        raise SystemExit("no conversations to run")

    history_root = args.history_dir
    temporary = with_history and history_root is None
    if temporary:
        history_root = Path(tempfile.mkdtemp(prefix="tandem-multiturn-history-"))
    records: list[dict[str, Any]] = []
    loads: list[dict[str, Any]] = []
    t_start = time.perf_counter()
    engines: dict[str, Any] = {}
    machine_info = machine()

    def results() -> dict[str, Any]:
        return {
            "machine": machine_info,
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "settings": {
                "target": args.target,
                "draft": args.draft,
                "max_tokens": args.max_tokens,
                "ctx": args.ctx,
                "threads": args.threads or os.cpu_count(),
                "modes": [m.name for m in modes],
                "temperature": 0.0,
                "prompts": str(args.conversations),  # bench.replay's name for the input file
                "conversations": [c["id"] for c in conversations],
                "repeats": args.repeats,
                "passes": 2 if second else 1,
                "history_dir": None if history_root is None or temporary else str(history_root),
                "shift": args.shift,
                "verify_ratios": loads[0]["verify_ratios"] if loads else None,  # the first load's (replay)
                "wall_seconds": round(time.perf_counter() - t_start, 1),
            },
            "notes": notes,
            "loads": loads,
            "runs": records,
        }

    try:
        for r in range(args.repeats):
            folder = None
            if with_history:
                folder = history_root / f"repeat-{r}"
                if folder.exists() and any(folder.iterdir()):
                    raise SystemExit(f"{folder} is not empty: each repeat's first pass starts a new history")
                folder.mkdir(parents=True, exist_ok=True)
            for pass_no in (1, 2) if second else (1,):
                if not engines:
                    t0 = time.perf_counter()
                    engines = open_engines(args, modes, folder)
                    for e in {id(e): e for e in engines.values()}.values():
                        warm_up(
                            e,
                            e.chat_prompt([{"role": "user", "content": conversations[0]["turns"][0]}]),
                            modes,
                        )
                    load = {"repeat": r, "pass": pass_no, "load_seconds": round(time.perf_counter() - t0, 2)}
                    if folder is not None:
                        load["history_before"] = history_info(engines["auto-history"])
                label = f"r{r + 1} p{pass_no}" if second else f"r{r + 1}"
                records += run_pass(
                    engines, conversations, modes, args, repeat=r, pass_no=pass_no, label=label
                )
                if with_history or r == args.repeats - 1:  # without a history the pair is loaded once
                    load["verify_ratios"] = recorded_ratios(engines["plain"].costs)
                    if folder is not None:
                        load["history_after"] = history_info(engines["auto-history"])
                    loads.append(load)
                    close_engines(engines)
                    engines = {}
                write_json(args.out, {**results(), "complete": False})  # so far, should the run stop
    finally:
        close_engines(engines)
        if temporary:
            shutil.rmtree(history_root, ignore_errors=True)
    return results()


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1))


def main(args: argparse.Namespace) -> int:
    args.out = args.out or REPO / "bench" / "results" / time.strftime("multiturn-%Y%m%d-%H%M%S.json")
    data = run(args)
    data["summary"] = summarize(data)
    if args.timing_tokens > 0 and any(r["mode"] == "auto-history" for r in data["runs"]):
        from app.engine.history.timing import measure

        data["history_timing"] = {"tokens": args.timing_tokens, **measure(args.timing_tokens, calls=500)}
    m = data["machine"]
    s = data["settings"]
    print(
        f"\nMulti-turn run, {data['date']}: {len(s['conversations'])} conversations, "
        f"{sum(1 for r in data['runs'] if r['mode'] == 'plain') // (s['repeats'] * s['passes'])} turns, "
        f"{s['repeats']} repeat(s), {s['passes']} pass(es), max {s['max_tokens']} new tokens, "
        f"{s['wall_seconds'] / 60:.1f} min"
    )
    print(f"machine: {m['cpu']}, {m['cores_logical']} threads, {m['ram_gib']} GiB, backend {m['backend']}")
    busy = [r["others_cpu"] for r in data["runs"] if r["mode"] == "plain" and r.get("others_cpu") is not None]
    if busy:
        print(
            f"other processes during the turns: median {statistics.median(busy):.2f} cores, max "
            f"{max(busy):.2f}; {sum(b > BUSY_CORES for b in busy)} of {len(busy)} turns over {BUSY_CORES}"
        )
    for note in data["notes"]:
        print(note)
    print()
    print(markdown_table(data["summary"], ["first", "revision", "all"]))
    kinds = sorted({r["kind"] for r in data["runs"]})
    print("\nBy kind:\n")
    print(markdown_table(data["summary"], [f"{k}/{c}" for k in kinds for c in ("first", "revision")]))
    lines = best_fixed_lines(data["summary"], ["first", "revision", "all"])
    if lines:
        print("\nAgainst the best fixed setting of the run:\n")
        print("\n".join(lines))
    for line in second_pass_check(data["summary"]):
        print(line)
    if "history_timing" in data:
        print(history_timing_line(data))
    write_json(args.out, {**data, "complete": True})
    print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.multiturn", description=__doc__)
    add_arguments(parser)
    sys.exit(main(parser.parse_args()))
