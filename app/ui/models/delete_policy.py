"""What Delete removes from disk, and what it asks first.

* A catalog pair: only its files in the Hugging Face cache, a whole cached revision at a time; the question
  lists the files and names the other installed pairs that share its draft. Files of the user's own
  folders are deleted one by one from the Installed tab.
* One file of the Installed list: a cache file deletes its revision; a file of a user folder is deleted
  alone (never outside the listed folders), after a "cannot be undone" question.

Finished download items of deleted files are forgotten, so the catalog shows them as not downloaded.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from app.ui.models.catalog_rows import PairRow, local_path
from app.ui.models.downloads import DONE, DownloadManager
from models_registry import library
from models_registry.catalog import Catalog
from models_registry.units import format_bytes

__all__ = ["DeleteHost", "DeletePolicy"]


class DeleteHost(Protocol):
    """What `DeletePolicy` uses of the Models panel (`app.ui.models.models_panel.ModelsPanel`)."""

    local: list[library.LocalModel]
    catalog: Catalog
    cache_dir: Path | None
    downloads: DownloadManager

    confirm: Callable[[str, str], bool]  # asks the user

    def row(self, pair_id: str) -> PairRow: ...

    def show_message(self, text: str, level: str = "info") -> None: ...

    def folders(self) -> list[Path]: ...

    def refresh(self) -> None: ...


Revision = tuple[str | None, str | None]  # repo id, commit


class DeletePolicy:
    """Deletes for the Models panel: asks through ``panel.confirm``, reports through ``panel.show_message``
    and re-reads the disk (``panel.refresh``) afterwards."""

    def __init__(self, panel: DeleteHost) -> None:
        self.panel = panel

    def delete_pair(self, r: PairRow) -> bool:
        """Delete the downloaded files of a pair from the HF cache (after confirmation)."""
        paths = {p for p in (r.target_path, r.draft_path) if p is not None}
        victims = [lm for lm in self.panel.local if lm.path in paths and lm.source == "hf-cache"]
        in_folders = [p for p in paths if not any(lm.path == p for lm in victims)]
        if not victims:
            note = " (delete files of your own folders in the Installed tab)." if in_folders else "."
            self.panel.show_message("Nothing of this pair is in the Hugging Face cache" + note, "error")
            return False
        revs = {(lm.repo_id, lm.commit) for lm in victims}
        return self.delete_revisions(revs, extra_note=self._shared_note(r))

    def _shared_note(self, r: PairRow) -> str:
        panel = self.panel
        others = [p.id for p in panel.catalog.pairs if p.id != r.pair.id and p.draft == r.draft.id
                  and local_path(panel.catalog.model(p.target), panel.row(p.id).target_quant,
                                 panel.local)]  # fmt: skip
        if others:
            return f"\n\nThe draft {r.draft.name} is also used by: {', '.join(others)}."
        return ""

    def delete_local(self, lm: library.LocalModel) -> bool:
        """Delete one file of the Installed list (a whole cache revision, or a file of a user folder)."""
        panel = self.panel
        if lm.source == "hf-cache":
            return self.delete_revisions({(lm.repo_id, lm.commit)})
        if not panel.confirm("Delete model file", f"Delete {lm.path} ({format_bytes(lm.size)}) from disk?\n\n"
                             "This cannot be undone."):  # fmt: skip
            return False
        try:
            freed = library.delete_user_file(lm.path, folders=panel.folders())
        except (library.LibraryError, OSError) as e:
            panel.show_message(str(e), "error")
            return False
        panel.show_message(f"Deleted {lm.path.name}, {format_bytes(freed)} freed.", "ok")
        panel.refresh()
        return True

    def delete_revisions(self, revs: set[Revision], extra_note: str = "") -> bool:
        """Delete whole revisions of the HF cache (after confirmation listing their files)."""
        panel = self.panel
        files = [lm for lm in panel.local if lm.source == "hf-cache" and (lm.repo_id, lm.commit) in revs]
        listing = "\n".join(f"  • {lm.display_name} ({format_bytes(lm.size)})" for lm in files)
        total = sum(lm.size for lm in files)
        if not panel.confirm(
            "Delete downloaded models",
            f"Delete these files from the Hugging Face cache ({format_bytes(total)})?\n\n"
            f"{listing}{extra_note}\n\n"
            "You can download them again later.",
        ):
            return False
        freed = 0
        errors = []
        for repo, commit in sorted(revs, key=str):
            if repo is None or commit is None:
                continue
            try:
                freed += library.delete_cached_revision(repo, commit, cache_dir=panel.cache_dir)
            except (library.LibraryError, OSError) as e:
                errors.append(str(e))
        for lm in files:  # forget finished download items so the rows show "Not downloaded"
            it = panel.downloads.find(lm.repo_id or "", lm.filename or "")
            if it is not None and it.state == DONE:
                panel.downloads.remove(it.key)
        panel.refresh()
        if errors:
            panel.show_message("; ".join(errors), "error")
            return False
        panel.show_message(f"Deleted {len(files)} file(s), {format_bytes(freed)} freed.", "ok")
        return True
