"""Workspace patches (no docker): unsafe diffs are rejected before git sees them; good unified diffs and
SEARCH/REPLACE blocks apply and come back as the canonical `git diff`; reset restores the baseline."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandbox.errors import PatchRejected, WorkspaceError
from sandbox.workspace import Workspace

MODEL = """def forward(x):
    y = x * 2
    return y


def helper():
    return 1


def other():
    return 1
"""


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    src = tmp_path / "src" / "pkg"
    src.mkdir(parents=True)
    (src / "__init__.py").write_text("")
    (src / "model.py").write_text(MODEL)
    (src / "kernel.so").write_bytes(b"\x7fELF binary")
    return Workspace.create(tmp_path / "ws", serving={"dtype": "float32"}, package="pkg", source=src)


GOOD_DIFF = """--- a/pkg/model.py
+++ b/pkg/model.py
@@ -1,3 +1,3 @@
 def forward(x):
-    y = x * 2
+    y = x + x
     return y
"""


def _diff(old: str, new: str, body: str = "@@ -1 +1 @@\n-a\n+b\n", extra: str = "") -> str:
    return f"diff --git a/{old} b/{new}\n{extra}--- a/{old}\n+++ b/{new}\n{body}"


@pytest.mark.parametrize(
    ("patch", "why"),
    [
        (_diff("../outside.py", "../outside.py"), "leaves the workspace"),
        (_diff("pkg/../../outside.py", "pkg/../../outside.py"), "leaves the workspace"),
        ("--- /etc/passwd\n+++ /etc/passwd\n@@ -1 +1 @@\n-a\n+b\n", "absolute"),
        (
            "diff --git a/pkg/link b/pkg/link\nnew file mode 120000\n--- /dev/null\n+++ b/pkg/link\n"
            "@@ -0,0 +1 @@\n+/etc/passwd\n",
            "symlink",
        ),
        (
            "diff --git a/pkg/model.py b/../model.py\nsimilarity index 100%\nrename from pkg/model.py\n"
            "rename to ../model.py\n",
            "leaves the workspace",
        ),
        (
            "diff --git a/pkg/kernel.so b/pkg/kernel.so\nindex 1111111..2222222 100644\nGIT binary patch\n"
            "literal 3\nKcmZ>Y&;S4c\n\n",
            "binary hunk",
        ),
        ("diff --git a/pkg/model.py b/pkg/model.py\nold mode 100644\nnew mode 100755\n", "mode change"),
        (_diff(".git/config", ".git/config"), "inside .git"),
        ("", "empty patch"),
    ],
)
def test_an_unsafe_patch_is_rejected_and_leaves_the_tree_clean(ws: Workspace, patch: str, why: str) -> None:
    head = ws.head()
    with pytest.raises(PatchRejected, match=why):
        ws.apply_patch(patch)
    assert ws.is_clean()
    assert ws.head() == head


def test_a_good_unified_diff_applies_and_returns_the_canonical_diff(ws: Workspace) -> None:
    canonical = ws.apply_patch(GOOD_DIFF)
    assert canonical.startswith("diff --git a/pkg/model.py b/pkg/model.py\n")
    assert "+    y = x + x\n" in canonical
    assert "y = x + x" in (ws.root / "pkg" / "model.py").read_text()


def test_a_diff_that_does_not_apply_is_rejected(ws: Workspace) -> None:
    with pytest.raises(PatchRejected, match="git apply --check failed"):
        ws.apply_patch(GOOD_DIFF.replace("x * 2", "x * 3"))
    assert ws.is_clean()


def test_reset_restores_the_baseline(ws: Workspace) -> None:
    ws.apply_patch(GOOD_DIFF)
    (ws.root / "pkg" / "stray.py").write_text("junk")
    ws.reset()
    assert ws.is_clean()
    assert (ws.root / "pkg" / "model.py").read_text() == MODEL
    assert not (ws.root / "pkg" / "stray.py").exists()


def test_a_dirty_workspace_refuses_a_new_patch(ws: Workspace) -> None:
    ws.apply_patch(GOOD_DIFF)
    with pytest.raises(WorkspaceError, match="uncommitted changes"):
        ws.apply_search_replace("pkg/model.py\n<<<<<<< SEARCH\nhelper\n=======\nhelp\n>>>>>>> REPLACE\n")


def test_search_replace_exact_match_gives_the_same_diff_as_the_unified_diff(ws: Workspace) -> None:
    blocks = "pkg/model.py\n<<<<<<< SEARCH\n    y = x * 2\n=======\n    y = x + x\n>>>>>>> REPLACE\n"
    via_blocks = ws.apply_search_replace(blocks)
    ws.reset()
    assert via_blocks == ws.apply_patch(GOOD_DIFF)


def test_search_replace_in_a_fenced_reply_with_several_blocks(ws: Workspace) -> None:
    reply = (
        "Here is the change:\n\n```python\npkg/model.py\n<<<<<<< SEARCH\n    y = x * 2\n=======\n"
        "    y = x + x\n>>>>>>> REPLACE\n```\n\n```python\npkg/model.py\n<<<<<<< SEARCH\n"
        "def helper():\n    return 1\n=======\ndef helper():\n    return 2\n>>>>>>> REPLACE\n```\n"
    )
    diff = ws.apply_search_replace(reply)
    assert "+    y = x + x" in diff and "+    return 2" in diff


def test_search_replace_tolerates_trailing_whitespace_and_indentation(ws: Workspace) -> None:
    # The SEARCH lost its indentation and gained trailing spaces; the replacement is re-indented.
    blocks = (
        "pkg/model.py\n<<<<<<< SEARCH\ny = x * 2   \nreturn y\n=======\n"
        "y = x + x\nreturn y\n>>>>>>> REPLACE\n"
    )
    ws.apply_search_replace(blocks)
    assert (ws.root / "pkg" / "model.py").read_text() == MODEL.replace("x * 2", "x + x")


def test_search_replace_with_an_empty_search_creates_a_file(ws: Workspace) -> None:
    diff = ws.apply_search_replace("pkg/new_kernel.py\n<<<<<<< SEARCH\n=======\nVALUE = 3\n>>>>>>> REPLACE\n")
    assert "new file mode 100644" in diff
    assert (ws.root / "pkg" / "new_kernel.py").read_text() == "VALUE = 3\n"


@pytest.mark.parametrize(
    ("blocks", "why"),
    [
        ("../evil.py\n<<<<<<< SEARCH\n=======\nx\n>>>>>>> REPLACE\n", "leaves the workspace"),
        ("/etc/passwd\n<<<<<<< SEARCH\nroot\n=======\nx\n>>>>>>> REPLACE\n", "absolute"),
        (".git/hooks/pre-commit\n<<<<<<< SEARCH\n=======\nx\n>>>>>>> REPLACE\n", "inside .git"),
        ("pkg/model.py\n<<<<<<< SEARCH\nnot there\n=======\nx\n>>>>>>> REPLACE\n", "not found"),
        ("pkg/model.py\n<<<<<<< SEARCH\n    return 1\n=======\nx\n>>>>>>> REPLACE\n", "matches 2 places"),
        ("pkg/model.py\n<<<<<<< SEARCH\nx\n=======\ny\n", "not closed"),
        ("pkg/missing.py\n<<<<<<< SEARCH\nx\n=======\ny\n>>>>>>> REPLACE\n", "does not exist"),
        ("pkg/kernel.so\n<<<<<<< SEARCH\nELF\n=======\nFLE\n>>>>>>> REPLACE\n", "not UTF-8|not found"),
        ("just prose, no blocks", "no SEARCH/REPLACE blocks"),
    ],
)
def test_a_bad_search_replace_is_rejected(ws: Workspace, blocks: str, why: str) -> None:
    with pytest.raises(PatchRejected, match=why):
        ws.apply_search_replace(blocks)
    assert ws.is_clean()


def test_search_replace_through_a_symlink_is_rejected(ws: Workspace, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "target.py").write_text("secret = 1\n")
    os.symlink(outside, ws.root / "pkg" / "escape")
    ws.commit("a symlink that an earlier step let in")
    with pytest.raises(PatchRejected, match="symlink"):
        ws.apply_search_replace(
            "pkg/escape/target.py\n<<<<<<< SEARCH\nsecret = 1\n=======\nsecret = 2\n>>>>>>> REPLACE\n"
        )
    assert (outside / "target.py").read_text() == "secret = 1\n"


def test_the_content_hash_is_the_tree_hash_the_patched_content_will_commit_as(ws: Workspace, tmp_path: Path) -> None:
    assert ws.content_hash() == ws.tree_hash()                        # clean: the commit's own tree
    copy = Workspace.open(ws.checkout_copy("HEAD", tmp_path / "copy"), "pkg")
    assert (copy.root / "pkg" / "kernel.so").exists()                 # linked binaries are ignored content
    assert copy.content_hash() == ws.tree_hash()
    diff = copy.apply_patch(GOOD_DIFF)
    patched = copy.content_hash()
    assert patched != ws.tree_hash()
    (copy.root / "pkg" / "new.py").write_text("x = 1\n")            # a new file is content too
    assert copy.content_hash() not in (patched, ws.tree_hash())
    assert "new.py" in copy.repo.git.status("--porcelain")            # hashing staged nothing
    assert "new.py" not in copy.repo.git.diff("--cached", "--name-only")
    (copy.root / "pkg" / "new.py").unlink()
    ws.apply_patch(diff)
    ws.commit("the same patch, committed")
    assert ws.tree_hash() == patched
    ws.remove_copy(copy.root)
