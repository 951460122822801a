"""The reply stream: one reply written into the chat view as the engine's steps arrive.

`ReplyStream` starts a reply, collects the worker's steps, re-renders the reply at most ~30 times a second
with the gauges, and stores the reply (with its stats) or the error when it ends.
"""

from __future__ import annotations

import time
from dataclasses import replace

from PySide6.QtCore import QObject, QTimer, Signal

from app.engine import Finished, FinishReason, Mode, Started, Step
from app.ui.chat.chat_view import ChatView, MessageWidget
from app.ui.chat.gauges import GaugesPanel
from app.ui.core.session import Session
from app.ui.shared.metrics import PlainCost, ReplyMeter, Rolling
from app.ui.shared.saved import SavedReply

__all__ = ["RENDER_INTERVAL_MS", "ReplyStream", "draft_spans"]

RENDER_INTERVAL_MS = 33  # at most ~30 re-renders a second while a reply streams


def draft_spans(saved: SavedReply | None) -> list[tuple[int, int]]:
    """The character spans of a stored reply whose tokens the draft proposed and the target accepted."""
    return list(saved.draft_spans) if saved is not None else []


class ReplyStream(QObject):
    """Streams the reply being written into ``chat``, ``gauges`` and the session's store."""

    finished = Signal(object)  # FinishReason
    failed = Signal(str)

    def __init__(self, session: Session, chat: ChatView, gauges: GaugesPanel) -> None:
        super().__init__(session)
        self.session, self.chat, self.gauges = session, chat, gauges
        self.meter: ReplyMeter | None = None
        self.rolling = Rolling()
        self.plain_cost = PlainCost()
        self.render_count = 0  # re-renders of the streaming reply (tests, benchmark)
        self.widget: MessageWidget | None = None
        self.chunks: list[str] = []
        self.conversation_id = 0
        self._mode: Mode | None = None
        self._last_render = 0.0
        self._dirty = False
        self._render_timer = QTimer(self)
        self._render_timer.setSingleShot(True)
        self._render_timer.timeout.connect(self.render)
        w = session.worker
        w.started.connect(self.on_started)
        w.steps.connect(self.on_steps)
        w.finished.connect(self.on_finished)
        w.failed.connect(self.on_failed)
        w.calibrated.connect(self.on_calibrated)
        session.pairLoaded.connect(lambda _info: setattr(self, "plain_cost", PlainCost()))

    def start(self, history: list[dict[str, str]]) -> None:
        """Add an empty assistant message to the chat and ask the worker for the reply to ``history``
        (the open conversation's messages)."""
        s = self.session
        assert s.conversation is not None
        settings = replace(s.generation(), history_doc=history_doc(s.conversation.id))
        self.conversation_id = s.conversation.id
        self.chunks = []
        self.widget = self.chat.add_message("assistant")
        # a reply sent right after a load waits for the short plain run that measures this machine
        self.widget.set_info(
            "waiting: the engine is measuring plain decoding first…" if s.calibrating else "thinking…"
        )
        if s.highlight:
            self.widget.set_highlight([])
        self.meter = ReplyMeter(t_sent=time.perf_counter())
        self._mode = Mode.REMOTE if s.remote is not None else settings.mode
        self.gauges.reset()
        self.render_count = 0
        s.set_generating(True, self.conversation_id)
        s.worker.generate(history, settings)

    def _visible(self) -> bool:
        """The reply's conversation is the one shown."""
        conv = self.session.conversation
        return conv is not None and conv.id == self.conversation_id

    def stop_rendering(self) -> None:
        self._render_timer.stop()

    # -- worker signals -----------------------------------------------------------------------------
    def on_started(self, ev: Started) -> None:
        if self.meter is not None:
            self.meter.started(ev)
        if self.widget is not None and not self.chunks:
            self.widget.set_info("thinking…")

    def on_steps(self, steps: list[Step]) -> None:
        if self.session.shut_down:  # a late event after the window closed
            return
        if self.meter is None:
            return
        now = time.perf_counter()
        for s in steps:
            self.meter.add(s, now)
            self.chunks.append(s.text)
        self.plain_cost.observe(steps)
        self._schedule_render()

    def on_calibrated(self, steps: list[Step]) -> None:
        self.plain_cost.observe(steps)

    def _schedule_render(self) -> None:
        self._dirty = True
        if self._render_timer.isActive():
            return
        wait = RENDER_INTERVAL_MS - (time.perf_counter() - self._last_render) * 1000
        self._render_timer.start(max(0, int(wait)))

    def render(self) -> None:
        """Show the streaming reply and the gauges (throttled to ~30 Hz)."""
        self._last_render = time.perf_counter()
        if not self._dirty or self.meter is None:
            return
        self._dirty = False
        self.render_count += 1
        w = self.widget
        if w is not None and self._visible():
            if self.session.highlight:
                w.text = "".join(self.chunks)
                w.set_highlight(list(self.meter.draft_spans))
            else:
                w.set_text("".join(self.chunks))
            w.set_info(f"{self.meter.n_tokens} tokens…")
        self.show_gauges()

    def show_gauges(self) -> None:
        if self.meter is not None:
            where = self.session.where()
            # the cost of plain decoding here says nothing about a remote server's speedup
            plain = self.plain_cost.value if self._mode is not Mode.REMOTE else None
            self.gauges.show_reply(self.meter, self.rolling, plain, where, self._mode)

    def on_finished(self, fin: Finished | None) -> None:
        s = self.session
        if s.shut_down:  # a late event after the window closed
            return
        self._render_timer.stop()
        meter, w = self.meter, self.widget
        s.set_generating(False)
        if meter is None or w is None:
            return
        if fin is None:  # cancelled before it started
            self.discard()
            self.finished.emit(FinishReason.CANCELLED)
            return
        meter.finish(fin)
        self.rolling.add(meter)
        saved = meter.saved()
        text = fin.text
        kept = bool(text) or fin.reason is not FinishReason.CANCELLED
        if kept:
            msg = s.store.add_message(self.conversation_id, "assistant", text, saved)
            w.message_id = msg.id
        if self._visible():
            if kept:
                self._dirty = True
                self.render()
                w.text = text
                if s.highlight:
                    w.set_highlight(draft_spans(saved))
                else:
                    w.set_text(text)
                w.set_saved(saved)
            else:
                self.chat.remove_from(len(self.chat.messages) - 1)
        self.show_gauges()
        self.widget = None
        self.finished.emit(fin.reason)

    def on_failed(self, message: str, crashed: bool) -> None:
        s = self.session
        if s.shut_down:  # a late event after the window closed
            return
        if not s.generating:  # e.g. a failure outside a reply
            s.notify(message, 10000)
            return
        self._render_timer.stop()
        s.set_generating(False)
        partial = "".join(self.chunks)
        if self.widget is not None:
            if partial:
                saved = (self.meter or ReplyMeter()).saved(FinishReason.ERROR)
                msg = s.store.add_message(self.conversation_id, "assistant", partial, saved)
                self.widget.message_id = msg.id
                self.widget.set_text(partial)
                self.widget.set_saved(saved)
                self.widget.set_info("interrupted")
            else:
                self.discard()
        self.widget = None
        if crashed:
            message += " Restarting it with the same models; your conversation is kept."
        err = s.store.add_message(self.conversation_id, "error", message)
        if self._visible():
            self.chat.add_message("error", message, message_id=err.id)
        self.failed.emit(message)

    def discard(self) -> None:
        """Remove the reply's message from the chat (nothing of it was written)."""
        chat = self.chat
        if self.widget is not None and chat.messages and chat.messages[-1] is self.widget:
            chat.remove_from(len(chat.messages) - 1)
        self.widget = None
        self.session.stateChanged.emit()


def history_doc(conversation_id: int) -> str:
    """The drafting history's name for a conversation of the app."""
    return f"chat-{conversation_id}"
