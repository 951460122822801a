"""The reply stream: one reply written into the chat view as the engine's steps arrive.

`ReplyStream` starts a reply, collects the worker's steps, re-renders the reply at most ~30 times a second
with the gauges, and stores the reply (with its stats) or the error when it ends.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, QTimer

from app.engine import Finished, Started, Step
from app.ui.chat_view import MessageWidget
from app.ui.metrics import PlainCost, ReplyMeter, Rolling

if TYPE_CHECKING:
    from app.ui.main_window import MainWindow

__all__ = ["RENDER_INTERVAL_MS", "ReplyStream", "draft_spans"]

RENDER_INTERVAL_MS = 33  # at most ~30 re-renders a second while a reply streams


def draft_spans(stats: dict[str, Any]) -> list[tuple[int, int]]:
    """The character spans of a stored reply whose tokens the draft proposed and the target accepted."""
    return [tuple(s) for s in stats.get("draft_spans") or []]  # type: ignore[misc]


class ReplyStream(QObject):
    """Streams the reply being written into ``main``'s chat view, gauges and store."""

    def __init__(self, main: MainWindow) -> None:
        super().__init__(main)
        self.main = main
        self.meter: ReplyMeter | None = None
        self.rolling = Rolling()
        self.plain_cost = PlainCost()
        self.render_count = 0  # re-renders of the streaming reply (tests, benchmark)
        self.widget: MessageWidget | None = None
        self.chunks: list[str] = []
        self.conversation_id = 0
        self._mode = ""
        self._last_render = 0.0
        self._dirty = False
        self._render_timer = QTimer(self)
        self._render_timer.setSingleShot(True)
        self._render_timer.timeout.connect(self.render)

    def start(self) -> None:
        """Add an empty assistant message to the chat and ask the worker for the current conversation's
        reply."""
        w = self.main
        assert w.conversation is not None
        history = w.conversations.history()
        settings = replace(
            w.settings.generation(has_draft=w.status.has_draft), history_doc=history_doc(w.conversation.id)
        )
        self.conversation_id = w.conversation.id
        self.chunks = []
        self.widget = w.chat.add_message("assistant")
        w.wire_message(self.widget)
        # a reply sent right after a load waits for the short plain run that measures this machine
        self.widget.set_info(
            "waiting: the engine is measuring plain decoding first…" if w.calibrating else "thinking…"
        )
        if w.highlight_action.isChecked():
            self.widget.set_highlight([])
        self.meter = ReplyMeter(t_sent=time.perf_counter())
        self._mode = "remote" if w.status.remote is not None else settings.mode
        w.gauges.reset()
        self.render_count = 0
        w.set_generating(True)
        w.worker.generate(history, settings)

    def stop_rendering(self) -> None:
        self._render_timer.stop()

    # -- worker signals -----------------------------------------------------------------------------
    def on_started(self, ev: Started) -> None:
        if self.meter is not None:
            self.meter.started(ev)
        if self.widget is not None and not self.chunks:
            self.widget.set_info("thinking…")

    def on_steps(self, steps: list[Step]) -> None:
        if self.main.shut_down:  # a late event after the window closed
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
        main = self.main
        if w is not None and main.conversation and main.conversation.id == self.conversation_id:
            if main.highlight_action.isChecked():
                w.text = "".join(self.chunks)
                w.set_highlight(list(self.meter.draft_spans))
            else:
                w.set_text("".join(self.chunks))
            w.set_info(f"{self.meter.n_tokens} tokens…")
        self.show_gauges()

    def show_gauges(self) -> None:
        if self.meter is not None:
            where = self.main.status.where()
            # the cost of plain decoding here says nothing about a remote server's speedup
            plain = self.plain_cost.value if self._mode != "remote" else None
            self.main.gauges.show_reply(self.meter, self.rolling, plain, where, self._mode)

    def on_finished(self, fin: Finished | None) -> None:
        main = self.main
        if main.shut_down:  # a late event after the window closed
            return
        self._render_timer.stop()
        meter, w = self.meter, self.widget
        main.set_generating(False)
        if meter is None or w is None:
            return
        if fin is None:  # cancelled before it started
            self.discard()
            main.replyFinished.emit("cancelled")
            return
        meter.finish(fin)
        self.rolling.add(meter)
        stats = meter.to_stats()
        text = fin.text
        if text or fin.reason != "cancelled":
            msg = main.store.add_message(self.conversation_id, "assistant", text, stats)
            w.message_id = msg.id
        visible = main.conversation is not None and main.conversation.id == self.conversation_id
        if visible:
            if text or fin.reason != "cancelled":
                self._dirty = True
                self.render()
                w.text = text
                if main.highlight_action.isChecked():
                    w.set_highlight(draft_spans(stats))
                else:
                    w.set_text(text)
                w.set_stats(stats)
            else:
                main.chat.remove_from(len(main.chat.messages) - 1)
        self.show_gauges()
        self.widget = None
        main.update_actions()
        main.conversations.refresh()
        main.replyFinished.emit(fin.reason)

    def on_failed(self, message: str, crashed: bool) -> None:
        main = self.main
        if main.shut_down:  # a late event after the window closed
            return
        if not main.generating:  # e.g. a failure outside a reply
            main.statusBar().showMessage(message, 10000)
            return
        self._render_timer.stop()
        main.set_generating(False)
        partial = "".join(self.chunks)
        if self.widget is not None:
            if partial:
                stats = self.meter.to_stats() if self.meter else {}
                stats["reason"] = "error"
                msg = main.store.add_message(self.conversation_id, "assistant", partial, stats)
                self.widget.message_id = msg.id
                self.widget.set_text(partial)
                self.widget.set_stats(stats)
                self.widget.set_info("interrupted")
            else:
                self.discard()
        self.widget = None
        if crashed:
            message += " Restarting it with the same models; your conversation is kept."
        err = main.store.add_message(self.conversation_id, "error", message)
        if main.conversation and main.conversation.id == self.conversation_id:
            main.wire_message(main.chat.add_message("error", message, message_id=err.id))
        main.update_actions()
        main.replyFailed.emit(message)

    def discard(self) -> None:
        """Remove the reply's message from the chat (nothing of it was written)."""
        chat = self.main.chat
        if self.widget is not None and chat.messages and chat.messages[-1] is self.widget:
            chat.remove_from(len(chat.messages) - 1)
        self.widget = None
        self.main.update_actions()


def history_doc(conversation_id: int) -> str:
    """The drafting history's name for a conversation of the app."""
    return f"chat-{conversation_id}"
