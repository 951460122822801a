"""PyInstaller hook for llguidance (structured output's grammar engine): its package reads its own version
from its metadata when imported (``importlib.metadata.version``), so the frozen app carries its dist-info.
Its Rust extension (``llguidance/_lib.abi3.so``) is found through the imports."""

from PyInstaller.utils.hooks import copy_metadata

datas = copy_metadata("llguidance")
