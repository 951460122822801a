"""Chat with a remote OpenAI-compatible server (another machine's ``tandem serve``, llama.cpp's
``llama-server``, vLLM) through the interface the app's engine worker uses. No Qt here.

:class:`RemoteClient` mirrors the parts of ``app.engine.EngineClient`` the worker calls: ``connect()``
(the counterpart of ``load``: checks the server and the model, returns a :class:`RemoteInfo` for the
status bar), ``generate(messages=..., settings=...)`` (a stream of ``app.engine`` ``Started``, ``Step``
and ``Finished`` events built from the streamed chunks) and ``cancel()``. Each streamed chunk with text
is one ``Step`` (its token ids are unknown); the reply's counts come at the end from the server's
``usage`` (``stream_options.include_usage``) and, where it sends them, llama.cpp's ``timings``
(``draft_n`` and ``draft_n_accepted`` give the acceptance; ``tandem serve`` sends them too).
The ``openai`` package is imported on first use (it takes about a second).
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from app.engine import (
    Action,
    Decision,
    Finished,
    FinishReason,
    GenerationSettings,
    Mode,
    Policy,
    Source,
    Started,
    Stats,
    Step,
)

__all__ = ["RemoteClient", "RemoteInfo", "RemoteServerError", "RemoteStream", "normalize_base_url"]

TIMEOUT = 60.0  # seconds without a byte from the server before a reply fails
CONNECT_TIMEOUT = 10.0
_POLL = 0.1  # seconds between checks for a cancel while waiting for the next chunk
# the server's finish_reason -> the engine's reasons (any other: a stop string)
_REASONS = {"stop": FinishReason.EOG, "length": FinishReason.LENGTH}
_DECISION = Decision(Action.PLAIN, Policy.PLAIN)  # the server decides how it drafts; it does not say


class RemoteServerError(Exception):
    """A server could not be reached or refused a request; the message is meant for the user."""


@dataclass(frozen=True)
class RemoteInfo:
    """A server the chat uses: what the status bar shows."""

    name: str
    base_url: str
    model: str
    models: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """E.g. ``qwen2.5-7b-instruct on workstation``."""
        return f"{self.model} on {self.name}" if self.name else self.model

    @property
    def host(self) -> str:
        return urlsplit(self.base_url).netloc or self.base_url


def normalize_base_url(url: str) -> str:
    """The API's base URL from what a user types: a scheme is added (http), a bare host gets ``/v1``,
    trailing slashes go. ``host:8080`` -> ``http://host:8080/v1``."""
    url = url.strip()
    if not url:
        raise RemoteServerError("give the server's address, e.g. http://192.168.1.20:8080/v1")
    if "://" not in url:
        url = "http://" + url
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise RemoteServerError(f"{url!r} is not an http:// or https:// address")
    path = parts.path.rstrip("/")
    if not path:
        path = "/v1"
    return f"{parts.scheme}://{parts.netloc}{path}"


class RemoteClient:
    """One OpenAI-compatible server and the model the chat uses there. Thread-safe: ``cancel()`` from any
    thread stops the reply being streamed."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        model: str | None = None,
        *,
        name: str = "",
        timeout: float = TIMEOUT,
    ) -> None:
        self.base_url = normalize_base_url(base_url)
        self.api_key = api_key or ""
        self.model = model or None
        self.name = name or urlsplit(self.base_url).netloc
        self.timeout = timeout
        self.info: RemoteInfo | None = None
        self._api: Any = None
        self._stream: RemoteStream | None = None
        self._lock = threading.Lock()

    def _client(self) -> Any:
        if self._api is None:
            import openai

            self._api = openai.OpenAI(
                base_url=self.base_url,
                api_key=self.api_key or "none",  # servers without a key ignore it; the client needs one
                max_retries=0,
                timeout=openai.Timeout(self.timeout, connect=CONNECT_TIMEOUT),
            )
        return self._api

    def list_models(self) -> list[str]:
        """The model ids the server offers (``GET /v1/models``)."""
        try:
            return [m.id for m in self._client().models.list().data]
        except Exception as e:
            raise RemoteServerError(describe_error(e, self.name, self.base_url)) from None

    def connect(self) -> RemoteInfo:
        """Check that the server answers with the key, and that it offers ``model`` (the first model it
        lists when none was chosen): what the status bar shows."""
        models = self.list_models()
        if not models:
            raise RemoteServerError(f"{self.name} lists no models")
        if self.model is None:
            self.model = models[0]
        elif self.model not in models:
            raise RemoteServerError(
                f"{self.name} does not offer {self.model!r}; it offers {', '.join(models[:8])}"
            )
        self.info = RemoteInfo(self.name, self.base_url, self.model, tuple(models))
        return self.info

    def generate(
        self,
        prompt: Sequence[int] | None = None,
        messages: Sequence[Mapping[str, Any]] | None = None,
        settings: GenerationSettings | None = None,
    ) -> RemoteStream:
        """Stream a reply to ``messages`` (chat completions); yields Started, Steps, then Finished."""
        if messages is None or prompt is not None:
            raise RemoteServerError("a remote server takes chat messages, not token ids")
        if self.model is None:
            self.connect()
        stream = RemoteStream(self, [dict(m) for m in messages], settings or GenerationSettings())
        with self._lock:
            self._stream = stream
        return stream.start()

    def cancel(self) -> None:
        """Stop the reply being streamed (it ends with ``Finished("cancelled")`` at once)."""
        with self._lock:
            stream = self._stream
        if stream is not None:
            stream.cancel()

    def shutdown(self) -> None:
        self.cancel()

    def request(self, messages: list[dict[str, Any]], settings: GenerationSettings) -> dict[str, Any]:
        """The chat completion request's arguments for ``settings``: the standard fields, and llama.cpp's
        ``top_k``, ``min_p`` and ``repeat_penalty`` (which tandem serve, llama-server and vLLM read)
        only when they are on, so that stricter servers are not offered fields they refuse."""
        s = settings.sampling
        args: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": s.temperature,
            "max_tokens": settings.max_tokens,
        }
        if s.top_p < 1.0:  # unset, a server applies its own default (llama.cpp's: 0.95)
            args["top_p"] = s.top_p
        if s.seed is not None:
            args["seed"] = s.seed
        if s.presence_penalty:
            args["presence_penalty"] = s.presence_penalty
        if s.frequency_penalty:
            args["frequency_penalty"] = s.frequency_penalty
        if settings.stop:
            args["stop"] = list(settings.stop)
        extra: dict[str, Any] = {}
        if s.top_k > 0:
            extra["top_k"] = s.top_k
        if s.min_p > 0:
            extra["min_p"] = s.min_p
        if s.repeat_penalty != 1.0:
            extra["repeat_penalty"] = s.repeat_penalty
        if extra:
            args["extra_body"] = extra
        return args


_END = object()


class RemoteStream(Iterator[Started | Step | Finished]):
    """One reply from a server. The HTTP stream is read on its own thread, so ``cancel()`` ends the
    stream at once (the reader closes the connection when its next chunk arrives, which stops the reply
    on ``tandem serve`` and llama-server); iterate it on one thread."""

    def __init__(self, client: RemoteClient, messages: list[dict[str, Any]], settings: GenerationSettings):
        self.client, self.messages, self.settings = client, messages, settings
        self.done = False
        self._q: queue.Queue[Any] = queue.Queue()
        self._cancelled = threading.Event()
        self._thread = threading.Thread(target=self._read, name="tandem-remote-reply", daemon=True)
        self._t_sent = 0.0
        self._t_first: float | None = None  # the first chunk
        self._t_text: float | None = None  # the first chunk with text
        self._t_last = 0.0
        self._chunks: list[str] = []
        self._usage: Any = None
        self._timings: dict[str, Any] = {}
        self._reason: FinishReason | None = None
        self._ready: deque[Started | Step] = deque()  # events of the chunk read last

    def start(self) -> RemoteStream:
        self._t_sent = time.perf_counter()
        self._thread.start()
        return self

    # -- reader thread ------------------------------------------------------------------------------
    def _read(self) -> None:
        try:
            args = self.client.request(self.messages, self.settings)
            stream = self.client._client().chat.completions.create(**args)
            with contextlib.closing(stream):
                for chunk in stream:
                    if self._cancelled.is_set():
                        return  # closing the connection stops the server's reply
                    self._q.put(chunk)
        except Exception as e:
            if not self._cancelled.is_set():
                self._q.put(RemoteServerError(describe_error(e, self.client.name, self.client.base_url)))
        finally:
            self._q.put(_END)

    # -- consumer -----------------------------------------------------------------------------------
    def __iter__(self) -> RemoteStream:
        return self

    def __next__(self) -> Started | Step | Finished:
        while not self.done:
            if self._ready:
                return self._ready.popleft()
            if self._cancelled.is_set():
                return self._finish(FinishReason.CANCELLED)
            try:
                item = self._q.get(timeout=_POLL)
            except queue.Empty:
                continue
            if item is _END:  # the server's finish reason; none: cut short by a cancel, or ended
                ended = FinishReason.CANCELLED if self._cancelled.is_set() else FinishReason.EOG
                return self._finish(self._reason or ended)
            if self._cancelled.is_set():
                return self._finish(FinishReason.CANCELLED)
            if isinstance(item, BaseException):
                self.done = True
                raise item
            self._read_chunk(item)
        raise StopIteration

    def _read_chunk(self, chunk: Any) -> None:
        """Queue the events of one chunk: Started for the first one, a Step for each with text."""
        now = time.perf_counter()
        timings = getattr(chunk, "timings", None)  # llama.cpp's (and tandem serve's) extra field
        if isinstance(timings, dict):
            self._timings = timings
        if getattr(chunk, "usage", None) is not None:
            self._usage = chunk.usage
        text = ""
        for choice in chunk.choices or ():
            if choice.index == 0:
                text = (choice.delta.content or "") if choice.delta is not None else ""
                if choice.finish_reason:
                    self._reason = _REASONS.get(choice.finish_reason, FinishReason.STOP)
        if self._t_first is None:
            self._t_first = self._t_last = now
            self._ready.append(Started(n_prompt_tokens=0, n_prompt_cached=0, t_prompt=now - self._t_sent))
        if not text:
            return
        if self._t_text is None:
            self._t_text = now
        dt, self._t_last = now - self._t_last, now
        self._chunks.append(text)
        self._ready.append(
            Step(
                text=text,
                tokens=(),
                from_draft=(),
                n_drafted=0,
                n_accepted=0,
                k=0,
                drafter=Source.NONE,
                decision=_DECISION,
                t_draft=0.0,
                t_verify=0.0,
                t_round=dt,
                t_llama=0.0,
                began=time.monotonic(),
            )
        )

    def _finish(self, reason: FinishReason) -> Finished:
        self.done = True
        self._cancelled.set()
        return Finished(reason=reason, text="".join(self._chunks), tokens=(), stats=self.stats())

    def stats(self) -> Stats:
        """The reply's figures: the usage's counts and the server's timings where it sent them, else
        what this client measured (chunks, arrival times)."""
        t = self._timings
        usage = self._usage
        n_chunks = len(self._chunks)
        n = int(getattr(usage, "completion_tokens", 0) or t.get("predicted_n") or n_chunks)
        n_prompt = int(getattr(usage, "prompt_tokens", 0) or t.get("prompt_n", 0) + t.get("cache_n", 0))
        cached = int(t.get("cache_n") or _cached_tokens(usage))
        drafted, accepted = int(t.get("draft_n") or 0), int(t.get("draft_n_accepted") or 0)
        first = self._t_text if self._t_text is not None else self._t_last
        ttft = (self._t_text - self._t_sent) if self._t_text is not None else 0.0
        measured = max(0.0, self._t_last - first)  # from the first text to the last
        t_decode = float(t["predicted_ms"]) / 1000 if t.get("predicted_ms") else measured
        t_prompt = float(t["prompt_ms"]) / 1000 if t.get("prompt_ms") else ttft
        tps = float(t.get("predicted_per_second") or 0.0) or (n / t_decode if t_decode > 0 else 0.0)
        return Stats(
            drafted_by=_drafted_by(t.get("draft_sources")),
            mode=Mode.REMOTE,
            n_prompt_tokens=n_prompt,
            n_prompt_cached=cached,
            n_generated=n,
            n_drafted=drafted,
            n_accepted=accepted,
            acceptance_rate=accepted / drafted if drafted else 0.0,
            rounds=n_chunks,
            rounds_drafted=0,  # a server does not say how its drafts fell into rounds
            mean_accepted_length=0.0,
            tokens_per_round=n / n_chunks if n_chunks else 0.0,
            accepted_length_histogram=(),
            acceptance_by_position=(),
            t_prompt_s=t_prompt,
            t_decode_s=t_decode,
            t_draft_s=0.0,
            t_verify_s=0.0,
            t_llama_s=0.0,
            ttft_s=ttft,
            prompt_tokens_per_second=float(t.get("prompt_per_second") or 0.0),
            decode_tokens_per_second=tps,
            python_share=0.0,
        )

    def cancel(self) -> None:
        """End the stream now (any thread): the next event is ``Finished("cancelled")``."""
        if not self.done:
            self._cancelled.set()

    def close(self) -> None:
        self.cancel()
        self.done = True

    def __enter__(self) -> RemoteStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _cached_tokens(usage: Any) -> int:
    details = getattr(usage, "prompt_tokens_details", None)
    return int(getattr(details, "cached_tokens", 0) or 0)


def describe_error(e: BaseException, name: str, base_url: str) -> str:
    """A readable sentence for what went wrong talking to a server."""
    import openai

    if isinstance(e, RemoteServerError):
        return str(e)
    body = getattr(e, "body", None)
    detail = body.get("message") if isinstance(body, dict) else None
    detail = str(detail or getattr(e, "message", "") or e).rstrip(".")
    if isinstance(e, openai.AuthenticationError):
        return f"{name} refused the API key (401: {detail}). Check the key."
    if isinstance(e, openai.PermissionDeniedError):
        return f"{name} refused the request (403: {detail})."
    if isinstance(e, openai.NotFoundError):
        return f"{name} has no such model or endpoint (404: {detail}). Is {base_url} the API's base URL?"
    if isinstance(e, openai.RateLimitError):
        return f"{name} is busy (429: {detail}); try again shortly."
    if isinstance(e, openai.APITimeoutError):
        return f"{name} did not answer in time ({base_url})."
    if isinstance(e, openai.APIConnectionError):
        cause = e.__cause__ or e.__context__
        why = f": {cause}" if cause and str(cause) else ""
        return f"Cannot reach {base_url}{why}."
    if isinstance(e, openai.APIStatusError):
        return f"{name} answered {e.status_code}: {detail}."
    if isinstance(e, openai.APIError):
        return f"{name} reported an error: {detail}."
    return f"{type(e).__name__}: {e}"


def _drafted_by(sources: object) -> tuple[tuple[Source, int, int, int], ...]:
    """A Tandem server's ``timings.draft_sources`` as :attr:`Stats.drafted_by` (what is not one: none)."""
    if not isinstance(sources, dict):
        return ()
    known = {s.value: s for s in Source}
    out = []
    for name, v in sources.items():
        if name in known and isinstance(v, dict):
            try:
                out.append(
                    (
                        known[name],
                        int(v.get("rounds", 0)),
                        int(v.get("draft_n", 0)),
                        int(v.get("draft_n_accepted", 0)),
                    )
                )
            except (TypeError, ValueError):
                continue
    return tuple(out)
