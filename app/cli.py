"""The ``tandem`` command: no arguments starts the app; subcommands run the engine headless."""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from app import __version__
from app.cli_checks import (
    OneLineParser,
    check_model_file,
    ctx_size,
    draft_tokens,
    fewest_draft_tokens,
    positive_tokens,
    thread_count,
    top_k,
)


def _add_load_args(p: argparse.ArgumentParser, *, draft_flag: bool = True) -> None:
    p.add_argument("--target", required=True, help="target model (GGUF file)")
    if draft_flag:
        p.add_argument("--draft", help="draft model (GGUF file sharing the target's tokenizer)")
    p.add_argument(
        "--ctx", type=ctx_size, default=4096, help="context size in tokens, 256-16777216 (default 4096)"
    )
    p.add_argument(
        "--threads", type=thread_count, default=None, help="CPU threads, 1-512 (default: all cores)"
    )
    p.add_argument(
        "--gpu-layers",
        default="auto",
        metavar="auto|all|cpu|N",
        help="target layers on the GPU (default auto: as many as fit, all where they fit)",
    )
    p.add_argument(
        "--draft-gpu-layers",
        default="auto",
        metavar="auto|all|cpu|N",
        help="draft layers on the GPU (default auto: all of it where it fits)",
    )
    p.add_argument("--flash-attn", choices=("auto", "on", "off"), default="auto")


def _add_generation_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--mode",
        choices=("auto", "speculative", "plain", "lookup", "mtp"),
        default="auto",
        help="auto (default): drafts with prompt lookup and the draft model only when that is measured "
        "to pay on this machine; speculative: always draft with --draft; lookup: always draft "
        "from n-grams of the context; mtp: always draft with the model's own multi-token-prediction "
        "layers (Qwen3.5/3.6, GLM, MiMo, ... where the GGUF has them); plain: no drafting",
    )
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=top_k, default=0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--repeat-penalty", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--max-tokens", type=positive_tokens, default=512)
    p.add_argument(
        "--n-max",
        type=draft_tokens,
        default=8,
        help="most tokens drafted per round (auto mode: by the draft model; "
        "its prompt lookup may copy up to 15 where verifying them pays)",
    )
    p.add_argument(
        "--n-min", type=fewest_draft_tokens, default=1, help="fewest tokens drafted per round (adaptive)"
    )
    p.add_argument("--p-min", type=float, default=0.0, help="stop drafting under this draft confidence")
    p.add_argument("--no-adaptive", action="store_true", help="always draft --n-max tokens")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="tandem",
        description="Lossless speculative decoding for local LLMs. Without a command, starts the app.",
        epilog="Errors are one line on stderr with exit code 2. TANDEM_DEBUG=1 shows llama.cpp's log "
        "on the terminal (a model that does not load, a crash).",
    )
    parser.add_argument("--version", action="version", version=f"tandem {__version__}")
    parser.add_argument("--model", metavar="TARGET", help="start the app with this target model (GGUF)")
    parser.add_argument("--draft", metavar="DRAFT", help="... and this draft model (GGUF), with --model")
    parser.add_argument(
        "--self-test",
        action="store_true",
        help="load a bundled tiny model pair, check speculative output equals plain output, print figures",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    gen = sub.add_parser("generate", help="generate text headless (streams to stdout)")
    _add_load_args(gen)
    _add_generation_args(gen)
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    gen.add_argument("--system", default=None, help="system prompt (with --chat)")
    src = gen.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text")
    src.add_argument("--prompt-file", type=Path, help="read the prompt from a file ('-' for stdin)")
    gen.add_argument("--json", action="store_true", help="print one JSON object at the end instead")
    gen.add_argument(
        "--compare-plain",
        action="store_true",
        help="then generate the same reply by plain decoding and show where the two part, with the "
        "target's top-two logit gap there (a gap under 0.5 is a numerical tie)",
    )

    bench = sub.add_parser("bench", help="benchmark every mode on a prompt set (see bench/run.py)")
    from bench.run import add_arguments as add_bench_arguments

    add_bench_arguments(bench)

    serve = sub.add_parser("serve", help="serve the OpenAI API (chat and completions) on a model pair")
    from app.server.cli import add_arguments as add_serve_arguments

    add_serve_arguments(serve)

    chk = sub.add_parser("check", help="is DRAFT usable with TARGET? exit 0 yes, 1 no")
    chk.add_argument("target", help="target: a GGUF path, hf://OWNER/REPO/FILE.gguf[@REV] or a catalog id")
    chk.add_argument(
        "draft",
        nargs="?",
        help="draft: same forms (remote files are judged from their header only); without it, whether "
        "the target drafts for itself (multi-token-prediction layers)",
    )
    from models_registry.cli import add_subcommands as add_registry_subcommands

    add_registry_subcommands(sub)
    chk.add_argument("--json", action="store_true")
    return parser


def _fail(msg: str, code: int = 2) -> int:
    print(f"tandem: error: {msg}", file=sys.stderr)
    return code


def _read_prompt(args: argparse.Namespace) -> str:
    if args.prompt is not None:
        return args.prompt
    if str(args.prompt_file) == "-":
        return sys.stdin.read()
    try:
        return args.prompt_file.read_text(encoding="utf-8")
    except OSError as e:
        raise ValueError(f"cannot read prompt file {args.prompt_file}: {e.strerror}") from e


def cmd_generate(args: argparse.Namespace) -> int:
    from app.engine import (
        EngineError,
        Finished,
        FinishReason,
        GenerationSettings,
        LlamaError,
        LoadSettings,
        Mode,
        PromptTooLongError,
        SamplingError,
        Step,
        parse_gpu_layers,
    )

    try:
        text = _read_prompt(args)
        settings = GenerationSettings.from_options(
            args.mode,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            min_p=args.min_p,
            repeat_penalty=args.repeat_penalty,
            seed=args.seed,
            max_tokens=args.max_tokens,
            n_max=args.n_max,
            n_min=args.n_min,
            p_min=args.p_min,
            adaptive=not args.no_adaptive,
            stop=tuple(args.stop),
        )
        mode = settings.mode
        drafts_with_model = mode in (Mode.SPECULATIVE, Mode.AUTO)  # the draft model is loaded
        if mode is Mode.SPECULATIVE and not args.draft:
            raise EngineError("--mode speculative needs --draft (or use --mode lookup)")
        check_model_file(args.target)  # a broken file is one line here, not llama.cpp's log
        if args.draft and drafts_with_model:
            check_model_file(args.draft)
        load = LoadSettings(
            target=args.target,
            draft=args.draft if drafts_with_model else None,
            n_ctx=args.ctx,
            n_threads=args.threads,
            n_gpu_layers=parse_gpu_layers(args.gpu_layers),
            n_gpu_layers_draft=parse_gpu_layers(args.draft_gpu_layers),
            flash_attn={"auto": None, "on": True, "off": False}[args.flash_attn],
        )
    except (ValueError, EngineError, SamplingError) as e:
        return _fail(str(e))

    from app.engine import EngineClient, EngineCrashedError

    client = EngineClient()
    prev = signal.signal(signal.SIGINT, lambda *_: client.cancel())
    cancelled = False
    try:
        client.start()
        info = client.load(load)
        if args.chat:
            messages = [{"role": "system", "content": args.system}] if args.system else []
            messages.append({"role": "user", "content": text})
            prompt = client.tokenize(messages=messages)
        else:
            prompt = client.tokenize(text)
        finished = None
        streamed = 0
        for event in client.generate(prompt=prompt, settings=settings):
            if isinstance(event, Step) and not args.json:
                sys.stdout.write(event.text)
                sys.stdout.flush()
                streamed += len(event.text)
            elif isinstance(event, Finished):
                finished = event
        assert finished is not None
        cancelled = finished.reason is FinishReason.CANCELLED
        compared = None
        if args.compare_plain and not cancelled:
            compared = _compare_plain(client, prompt, settings, finished)
        if args.json:
            out = {
                "text": finished.text,
                "tokens": list(finished.tokens),
                "prompt_tokens": list(prompt),
                "finish_reason": finished.reason,
                "stats": finished.stats.to_dict(),
                "engine": info.to_dict(),
                "placement": info.placement(),
            }
            if compared is not None:
                out["plain_comparison"] = compared
            print(json.dumps(out, ensure_ascii=False))
        else:
            sys.stdout.write(finished.text[streamed:])  # text held back until the end, if any
            s = finished.stats
            print(f"\n[{info.placement()}]", file=sys.stderr)
            print(
                f"[{s.mode}] {s.n_generated} tokens, {s.decode_tokens_per_second:.1f} tok/s, "
                f"acceptance {s.acceptance_rate:.0%} ({s.n_accepted}/{s.n_drafted}), "
                f"{s.tokens_per_round:.2f} tokens/round, ttft {s.ttft_s * 1000:.0f} ms, "
                f"finish: {finished.reason}",
                file=sys.stderr,
            )
            if s.drafting_off is not None:
                print("[not drafting: the target's memory cannot undo a rejected draft]", file=sys.stderr)
            if compared is not None:
                print(f"[{_comparison_words(compared)}]", file=sys.stderr)
    except EngineCrashedError as e:
        return _fail(str(e), 3)
    except (ValueError, LlamaError, EngineError, PromptTooLongError) as e:
        return _fail(str(e))
    finally:
        signal.signal(signal.SIGINT, prev)
        client.shutdown()
    if not cancelled:
        _record_speed(args, load, info, finished.stats)
    return 130 if cancelled else 0


#: a top-two logit gap under this is a numerical tie: batched and single-token evaluation can round
#: either way there (the benchmarks' threshold)
TIE_GAP = 0.5


def _compare_plain(client: Any, prompt: list[int], settings: Any, finished: Any) -> dict[str, Any]:
    """Generate the same reply by plain decoding and say where the two part, and how close the
    target's call was there."""
    from dataclasses import replace

    from app.engine import Finished, Mode

    plain = None
    for event in client.generate(prompt=prompt, settings=replace(settings, mode=Mode.PLAIN)):
        if isinstance(event, Finished):
            plain = event
    assert plain is not None
    a, b = list(finished.tokens), list(plain.tokens)
    j = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
    if j is None and len(a) != len(b):
        j = min(len(a), len(b))
    out: dict[str, Any] = {
        "identical": j is None,
        "greedy": settings.sampling.greedy,
        "plain_tokens": b,
        "plain_text": plain.text,
    }
    if j is not None:
        gap = client.top2_gap([*prompt, *b[:j]])
        out.update(first_difference=j, top2_gap=gap, tie=gap < TIE_GAP)
    return out


def _comparison_words(c: dict[str, Any]) -> str:
    if c["identical"]:
        return "the same tokens as plain decoding"
    j, gap = c["first_difference"] + 1, c["top2_gap"]
    text = f"left plain decoding's text at token {j}, top-two logit gap {gap:.2f}"
    if not c["greedy"]:
        return text + " (sampled: replies differ by chance; compare with --temperature 0)"
    return text + (": a numerical tie" if c["tie"] else ": NOT a tie, please report it")


#: replies shorter than this say too little about a model's speed to be kept
RECORD_MIN_TOKENS = 32


def _record_speed(args: argparse.Namespace, load: Any, info: Any, stats: Any) -> None:
    """Keep the run's decode tokens/s for the speed estimate (`models_registry.measured`): under the
    target's file, where it ran (CPU, GPU or split) and the mode; plain decoding's is the target's own
    speed, another mode's is kept with the draft it ran with (speculative mode also keeps the draft's
    acceptance, and what its mean verify batch cost in plain decoding's steps when those are known).
    Not kept: replies under RECORD_MIN_TOKENS tokens and runs on fewer threads than the machine has
    cores."""
    import psutil

    from app.engine import Mode
    from app.gguf.split import first_part, model_bytes
    from models_registry.measured import SpeedStore, placement_of

    cores = psutil.cpu_count(logical=False) or os.cpu_count() or 1
    if stats.n_generated < RECORD_MIN_TOKENS or stats.decode_tokens_per_second <= 0:
        return
    if args.threads is not None and args.threads < cores:
        return
    try:
        store = SpeedStore()
        offload = info.target.offload
        placement = placement_of(offload.layers_offloaded, offload.layers_total)
        target = (first_part(load.target).name, model_bytes(load.target))  # a split model: its first part
        drafted = load.draft and stats.mode in (Mode.SPECULATIVE, Mode.AUTO)
        draft = (first_part(load.draft).name, model_bytes(load.draft)) if drafted else None
        acceptance, costs = None, None
        if stats.mode is Mode.SPECULATIVE and draft is not None and stats.n_drafted:
            acceptance = stats.acceptance_rate
            known = store.lookup(*target, placement=placement)
            if known is not None and known.plain and stats.rounds:
                batch = round((stats.rounds + stats.n_drafted) / stats.rounds)
                cost = stats.t_verify_s / stats.rounds * known.plain
                costs = {batch: cost} if 0.8 <= cost <= 1.5 * batch else None  # else the runs disagree
        store.record(
            *target, stats.decode_tokens_per_second, mode=stats.mode, placement=placement,
            draft=draft, acceptance=acceptance, verify_costs=costs,
        )  # fmt: skip
    except (OSError, ValueError) as e:
        print(f"tandem: the run's speed was not kept: {e}", file=sys.stderr)


def _engine_gpus() -> tuple[Any, ...] | None:
    """The GPUs the engine process lists (llama.cpp's devices, as `models_registry.fit.Gpu` records; none
    if the build cannot offload), or None when the engine does not start. Starting it takes about half a
    second."""
    from app.engine import EngineClient
    from models_registry.fit import gpus_from_devices

    try:
        with EngineClient(start_timeout=60) as client:
            status = client.info()
    except Exception as e:  # whatever stops the engine, the fit guesses the GPUs
        print(f"tandem: the engine did not start ({e}): GPUs are guessed", file=sys.stderr)
        return None
    return gpus_from_devices(status.devices) if status.gpu_offload else ()


def cmd_check(args: argparse.Namespace) -> int:
    """Whether the draft can drive the target (vocabularies), each model's architecture as speculation
    sees it, and what drafting the pair supports."""
    from app.gguf.arch import arch_facts
    from app.gguf.compat import check_compatible
    from app.gguf.drafts import draft_facts, mtp_layers
    from app.gguf.meta import GGUFError
    from models_registry.drafting import pair_drafting
    from models_registry.hub import HubError
    from models_registry.refs import resolve_model_ref
    from models_registry.remote import read_ref_metadata

    try:
        refs = [resolve_model_ref(a) for a in (args.target, args.draft) if a]
        for ref in refs:
            if isinstance(ref, Path):  # a local file: its tensors too (a remote one: its header only)
                check_model_file(ref)
        target, _ = read_ref_metadata(refs[0])
        draft = read_ref_metadata(refs[1])[0] if args.draft else None
    except (OSError, ValueError, GGUFError, HubError) as e:
        return _fail(str(e))
    n_mtp = mtp_layers(target)
    own = f"{n_mtp} multi-token-prediction layer{'s' * (n_mtp > 1)}: --mode mtp drafts with them"
    if draft is None:  # the target alone: does it draft for itself?
        if args.json:
            print(json.dumps({"target": {"architecture": target.architecture, "mtp_layers": n_mtp}}))
        else:
            print(f"target: {own}" if n_mtp else "target: no multi-token-prediction layers (give a draft)")
        return 0 if n_mtp else 1
    kind = draft_facts(draft)
    verdict = check_compatible(target, draft)
    facts = {"target": arch_facts(target), "draft": arch_facts(draft)}
    drafting = pair_drafting(facts["target"], facts["draft"])
    if args.json:
        out: dict[str, Any] = {"compatible": verdict.ok, "reason": verdict.reason}
        for role, f in facts.items():
            out[role] = {
                "architecture": f.architecture, "memory": f.memory.value, "rollback": f.rollback.value,
                "sliding_window": f.sliding_window, "experts": f.experts, "experts_used": f.experts_used,
                "moe": f.moe, "words": f.words,
            }  # fmt: skip
        out["draft"] |= {"kind": kind.kind.value, "mtp_layers": kind.mtp_layers}
        out["target"]["mtp_layers"] = n_mtp
        print(json.dumps({**out, "drafting": drafting.to_data()}))
    else:
        verdict_word = "compatible" if verdict.ok else "NOT compatible"
        print(verdict_word + (f": {verdict.reason}" if verdict.reason else ""))
        for role, f in facts.items():
            print(f"{role + ':':<8}{f.words}")
        print(drafting.words)
        print(f"kind:   {kind.words}" + (f"; the target itself has {own}" if n_mtp else ""))
    return 0 if verdict.ok else 1


def cmd_app(target: str | None = None, draft: str | None = None) -> int:
    """Start the desktop app (optionally with a model pair)."""
    if draft and not target:
        return _fail("--draft needs --model (the target it drafts for)")
    from app.preflight import check as preflight  # no display, or Qt's libraries missing: say so (no Qt yet)

    problem = preflight()
    if problem:
        print(problem, file=sys.stderr)
        return 1
    try:
        from app.ui.app import run_app
    except ImportError as e:  # e.g. Qt's system libraries are missing
        return _fail(f"the desktop app cannot start: {e}. The command line works: tandem --help")
    return run_app([sys.argv[0]], target=target, draft=draft)


def main(argv: Sequence[str] | None = None) -> int:
    """The ``tandem`` command."""
    multiprocessing.freeze_support()  # a frozen app's engine process starts through here (spawn)
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        return cmd_app()
    args = build_parser().parse_args(argv)
    if args.self_test:
        from app.selftest import run_self_test

        return run_self_test()
    if args.command == "generate":
        return cmd_generate(args)
    if args.command == "check":
        return cmd_check(args)
    if args.command == "serve":
        from app.server.cli import cmd_serve

        return cmd_serve(args)
    if args.command in ("models", "download"):
        if args.command == "models" and args.models_command == "fit":
            args.gpus = _engine_gpus()
        return args.handler(args)
    if args.command == "bench":
        from bench.run import main as bench_main

        return bench_main(args)
    return cmd_app(args.model, args.draft)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
