"""Pure helpers the views use: text (wording, Markdown, rich text), figures of a reply, the theme and
the main-thread garbage collection guard. They import nothing else of ``app.ui``."""
