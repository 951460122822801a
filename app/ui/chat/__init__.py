"""The chat: the conversations sidebar, the messages, the composer, the reply being written, the gauges
and the status bar."""
