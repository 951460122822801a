"""``tandem serve``: the OpenAI-compatible API on a loaded pair."""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

from app.server.api import allowed_hosts, create_app, is_loopback
from app.server.served import Served

DEFAULT_PORT = 8080


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model", required=True, help="target: a GGUF file or the catalog id of an installed model"
    )
    p.add_argument("--draft", help="draft: a GGUF file or the catalog id of an installed model")
    p.add_argument(
        "--mode",
        choices=("auto", "speculative", "lookup", "plain"),
        default="auto",
        help="how replies are drafted (default auto: whatever pays on this machine)",
    )
    p.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)"
    )
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    p.add_argument(
        "--api-key",
        default=os.environ.get("TANDEM_API_KEY"),
        help="require this key (Authorization: Bearer KEY); default $TANDEM_API_KEY. Needed off loopback",
    )
    p.add_argument(
        "--cors-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="allow browser pages from this origin (repeatable; none by default)",
    )
    p.add_argument("--queue", type=int, default=16, help="requests that may wait for the engine (then 429)")
    p.add_argument(
        "--no-history",
        action="store_true",
        help="do not draft from (or add requests to) the drafting history the app also keeps",
    )
    p.add_argument("--ctx", type=int, default=4096, help="context size in tokens (default 4096)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")
    p.add_argument("--gpu-layers", default="auto", metavar="auto|all|cpu|N", help="target layers on the GPU")
    p.add_argument(
        "--draft-gpu-layers", default="auto", metavar="auto|all|cpu|N", help="draft layers on the GPU"
    )


def resolve_model(ref: str) -> Path:
    """A GGUF path, or the file of an installed catalog model (a clear error when not downloaded)."""
    from models_registry.refs import resolve_model_ref

    got = resolve_model_ref(ref)
    if isinstance(got, Path):
        return got
    raise ValueError(f"{ref} is not downloaded yet: run `tandem download {ref}` first")


def check_exposure(host: str, api_key: str | None) -> None:
    """Refuse to serve beyond this machine without a key."""
    if not is_loopback(host) and not api_key:
        raise ValueError(
            f"--host {host} serves other machines: give --api-key (or set TANDEM_API_KEY), "
            "or keep the default 127.0.0.1"
        )


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from app.engine import EngineClient, EngineError, LoadSettings, parse_gpu_layers
    from app.paths import data_dir

    def fail(msg: str) -> int:
        print(f"tandem serve: error: {msg}", file=sys.stderr)
        return 2

    try:
        check_exposure(args.host, args.api_key)
        target = resolve_model(args.model)
        draft = resolve_model(args.draft) if args.draft else None
        if args.mode == "speculative" and draft is None:
            raise ValueError("--mode speculative needs --draft (or use --mode lookup or auto)")
        load = LoadSettings(
            target=str(target),
            draft=str(draft) if draft and args.mode != "lookup" else None,
            n_ctx=args.ctx,
            n_threads=args.threads,
            n_gpu_layers=parse_gpu_layers(args.gpu_layers),
            n_gpu_layers_draft=parse_gpu_layers(args.draft_gpu_layers),
            history_dir=None if args.no_history else str(data_dir() / "history"),
        )
    except (ValueError, EngineError) as e:
        return fail(str(e))

    client = EngineClient(auto_restart=True)
    loaded = threading.Event()
    served = Served(
        client,
        mode=args.mode,
        ready=loaded.is_set,
        model_path=str(target),
        n_ctx=args.ctx,
        created=int(time.time()),
    )
    served.turns.max_waiting = max(0, args.queue)
    app = create_app(
        served,
        api_key=args.api_key,
        allowed_hosts=allowed_hosts(args.host, args.port),
        cors_origins=args.cors_origin,
    )
    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level="warning"))
    failure: list[str] = []

    def load_models() -> None:
        try:
            client.start()
            info = client.load(load)
        except Exception as e:
            failure.append(str(e))
            server.should_exit = True
            return
        served.n_ctx = info.n_ctx
        loaded.set()
        url = f"http://{_url_host(args.host)}:{args.port}/v1"
        print(f"tandem serve: {served.model_id} ({args.mode}) at {url}", file=sys.stderr)
        print(f"tandem serve: {info.placement()}", file=sys.stderr)

    print(f"tandem serve: loading {target.name} (requests get 503 until it is loaded)", file=sys.stderr)
    threading.Thread(target=load_models, name="tandem-serve-load", daemon=True).start()
    try:
        server.run()
    finally:
        client.shutdown()
    if failure:
        return fail(f"could not load the model: {failure[0]}")
    return 0


def _url_host(host: str) -> str:
    if host in ("0.0.0.0", "::"):
        return "localhost"
    return f"[{host}]" if ":" in host else host
