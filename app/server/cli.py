"""``tandem serve``: the OpenAI-compatible API on a loaded pair."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from app.cli_checks import (
    bind_socket,
    check_model_file,
    ctx_size,
    draft_tokens,
    listen_error,
    port_number,
    thread_count,
)
from app.engine import MODES, Mode
from app.server.api import is_loopback

DEFAULT_PORT = 8080


def _mode(word: str) -> Mode | str:
    """``--mode``'s word as a Mode (argparse refuses other words with the list of choices)."""
    return Mode(word) if word in MODES else word


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model", required=True, help="target: a GGUF file or the catalog id of an installed model"
    )
    p.add_argument("--draft", help="draft: a GGUF file or the catalog id of an installed model")
    p.add_argument(
        "--mode",
        type=_mode,
        choices=[str(m) for m in (Mode.AUTO, Mode.SPECULATIVE, Mode.LOOKUP, Mode.MTP, Mode.PLAIN)],
        default=Mode.AUTO,
        help="how replies are drafted (default auto: whatever pays on this machine)",
    )
    p.add_argument(
        "--n-max",
        type=draft_tokens,
        default=8,
        help="most tokens drafted per round (default 8; auto mode: by the draft model, "
        "its prompt lookup may copy up to 15 where verifying them pays)",
    )
    p.add_argument(
        "--no-adaptive",
        action="store_true",
        help="speculative and lookup modes: always draft --n-max tokens (default: fewer where "
        "drafts are being rejected)",
    )
    p.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)"
    )
    p.add_argument(
        "--port",
        type=port_number,
        default=DEFAULT_PORT,
        help=f"port, 0-65535 (default {DEFAULT_PORT}; 0: any free port, announced)",
    )
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
    p.add_argument(
        "--ctx", type=ctx_size, default=4096, help="context size in tokens, 256-16777216 (default 4096)"
    )
    p.add_argument(
        "--threads", type=thread_count, default=None, help="CPU threads, 1-512 (default: all cores)"
    )
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
    """Check the arguments and the model files, bind the port, then load the pair in the background
    while the API answers 503; SIGTERM, SIGINT (and SIGHUP) stop it cleanly: the engine process is
    stopped and its folder removed, exit code 0."""
    from app.engine import EngineError, LoadSettings, parse_gpu_layers
    from app.paths import data_dir

    def fail(msg: str) -> int:
        print(f"tandem serve: error: {msg}", file=sys.stderr)
        return 2

    try:
        check_exposure(args.host, args.api_key)
        target = resolve_model(args.model)
        draft = resolve_model(args.draft) if args.draft else None
        if args.mode is Mode.SPECULATIVE and draft is None:
            raise ValueError("--mode speculative needs --draft (or use --mode lookup or auto)")
        check_model_file(target)  # a broken file is one line now, not llama.cpp's log after the port
        if args.mode is Mode.MTP:
            from app.gguf.drafts import mtp_layers
            from app.gguf.meta import read_metadata_file

            if not mtp_layers(read_metadata_file(target)):
                raise ValueError(
                    f"--mode mtp needs a model with multi-token-prediction layers; {target.name} has none"
                )
        own_drafts = args.mode in (Mode.LOOKUP, Mode.MTP)  # no draft model loaded for these
        if draft is not None and not own_drafts:
            check_model_file(draft)
        load = LoadSettings(
            target=str(target),
            draft=str(draft) if draft and not own_drafts else None,
            n_ctx=args.ctx,
            n_threads=args.threads,
            n_gpu_layers=parse_gpu_layers(args.gpu_layers),
            n_gpu_layers_draft=parse_gpu_layers(args.draft_gpu_layers),
            history_dir=None if args.no_history else str(data_dir() / "history"),
        )
    except (ValueError, EngineError) as e:
        return fail(str(e))
    try:
        sock = bind_socket(args.host, args.port)  # before the model loads: a port in use fails at once
    except OSError as e:
        return fail(listen_error(args.host, args.port, e))
    with sock, _stop_signals() as stop:
        return _serve(args, sock, stop, target, load, fail)


def _serve(args: argparse.Namespace, sock: Any, stop: _Stop, target: Path, load: Any, fail: Any) -> int:
    from app.engine import EngineClient
    from app.server.serving import api_server

    port = sock.getsockname()[1]
    client = EngineClient(auto_restart=True)
    loaded = threading.Event()
    api = api_server(  # its signals are left to _stop_signals
        client,
        args.host,
        port,
        mode=args.mode,
        ready=loaded.is_set,
        model_path=str(target),
        n_ctx=args.ctx,
        history=not args.no_history,  # requests join the drafting history, as the app's server does
        n_max=args.n_max,
        adaptive=not args.no_adaptive,
        max_waiting=args.queue,
        api_key=args.api_key,
        cors_origins=args.cors_origin,
        graceful_s=GRACE_S,
    )
    served, server = api.served, api.server
    stop.server = server
    failure: list[str] = []
    done = threading.Event()  # the server is down: the loader starts no engine

    def load_models() -> None:
        try:
            if done.is_set() or stop.requested:
                return
            client.start()
            info = client.load(load)
        except Exception as e:
            if not (done.is_set() or stop.requested):
                failure.append(str(e))
                server.should_exit = True
            return
        served.n_ctx = info.n_ctx
        loaded.set()
        url = f"http://{_url_host(args.host)}:{port}/v1"
        print(f"tandem serve: {served.model_id} ({args.mode}) at {url}", file=sys.stderr)
        print(f"tandem serve: {info.placement()}", file=sys.stderr)

    print(f"tandem serve: loading {target.name} (requests get 503 until it is loaded)", file=sys.stderr)
    loader = threading.Thread(target=load_models, name="tandem-serve-load", daemon=True)
    loader.start()
    try:
        if not stop.requested:
            api.run(sock)
    finally:
        done.set()
        client.shutdown()  # the engine process and its folder; a load in progress ends with it
        loader.join(client.stop_timeout + 5)
        client.shutdown()  # in case the loader started an engine meanwhile
    if failure:
        return fail(f"could not load the model: {failure[0]}")
    return 0


#: seconds the server waits for replies in progress when asked to stop, before it cuts them off
GRACE_S = 3


class _Stop:
    """Whether a signal asked the server to stop, and the server to tell."""

    def __init__(self) -> None:
        self.requested = False
        self.server: Any = None

    def handle(self, sig: int, frame: Any) -> None:
        if not self.requested:
            # os.write: a print here could re-enter one in progress
            with contextlib.suppress(OSError, ValueError):
                os.write(sys.stderr.fileno(), b"tandem serve: stopping\n")
        self.requested = True
        if self.server is not None:
            self.server.handle_exit(sig, frame)  # a second Ctrl-C cuts replies off at once


@contextlib.contextmanager
def _stop_signals() -> Iterator[_Stop]:
    """SIGINT, SIGTERM and SIGHUP stop the server through its own shutdown (uvicorn's handlers would
    raise the signal again once the server is down, skipping the engine's). From the main thread only."""
    stop = _Stop()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    sigs = [signal.SIGINT, signal.SIGTERM] + ([signal.SIGHUP] if hasattr(signal, "SIGHUP") else [])
    before = {sig: signal.signal(sig, stop.handle) for sig in sigs}
    try:
        yield stop
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def _url_host(host: str) -> str:
    if host in ("0.0.0.0", "::"):
        return "localhost"
    return f"[{host}]" if ":" in host else host
