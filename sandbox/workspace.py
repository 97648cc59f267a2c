"""Git workspaces of the target: the installed vLLM package (or a source checkout's, or a Docker image's:
sandbox/image_package.py) copied, `git init`-ed, and overlaid with PYTHONPATH. Git tracks the sources;
compiled `.so` files are hardlinked in (copied, out of an image: ≈435 MB that no patch may touch) and kept
out of git, present in the tree so that it shadows the package whole. Candidates are applied with
`git apply --check` first and become commits on a campaign branch, or are reset away."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import git
import yaml

from sandbox.errors import PatchRejected, WorkspaceError
from sandbox.patches import check_patch_paths

__all__ = ["Workspace", "PackageSource", "installed_package_dir", "SERVING_FILE"]

SERVING_FILE = "serving.yaml"
_BINARY_SUFFIXES = (".so",)
_GITIGNORE = "*.so\n__pycache__/\n*.pyc\n"
_IDENTITY = {"user.name": "ratchet", "user.email": "ratchet@localhost"}


def installed_package_dir(package: str = "vllm") -> Path:
    """Where the pristine package lives, found without importing it (importing vLLM takes seconds)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise WorkspaceError(f"package {package!r} is not installed in {os.sys.prefix}; run ./setup.sh")
    return Path(next(iter(spec.submodule_search_locations))).resolve()


class PackageSource(Protocol):
    """A package that is not a folder on this host (e.g. `ImagePackage`: inside a Docker image)."""

    def copy_into(self, dest: Path) -> None: ...   # the package folder, whole, at `dest` (absent before)


def _is_binary(path: Path) -> bool:
    return path.name.endswith(_BINARY_SUFFIXES)


def _copy_tree(src: Path, dest: Path) -> None:
    """Copy sources, hardlink binaries (fall back to copying across filesystems)."""

    def copy(s: str, d: str) -> str:
        if _is_binary(Path(s)):
            try:
                os.link(s, d)
                return d
            except OSError:
                pass
        return shutil.copy2(s, d)

    shutil.copytree(src, dest, copy_function=copy, ignore=shutil.ignore_patterns("__pycache__"), symlinks=False)


def _link_binaries(src: Path, dest: Path) -> None:
    """Bring the untracked binaries into a checkout of the tracked sources (a git worktree)."""
    for path in src.rglob("*"):
        if path.is_file() and _is_binary(path):
            target = dest / path.relative_to(src)
            target.parent.mkdir(parents=True, exist_ok=True)
            if not target.exists():
                try:
                    os.link(path, target)
                except OSError:
                    shutil.copy2(path, target)


@dataclass(frozen=True)
class Workspace:
    root: Path
    package: str = "vllm"

    @property
    def repo(self) -> git.Repo:
        return git.Repo(self.root)

    @classmethod
    def create(cls, root: Path, *, serving: dict[str, object], package: str = "vllm",
               source: Path | PackageSource | None = None, branch: str = "main") -> Workspace:
        """Copy `source` (a folder, a `PackageSource`, default: the installed package) to root/<package>,
        commit it as baseline."""
        root = root.resolve()
        if root.exists() and any(root.iterdir()):
            raise WorkspaceError(f"{root} exists and is not empty; remove it or choose another --workspace")
        root.mkdir(parents=True, exist_ok=True)
        if source is None or isinstance(source, Path):
            src: Path | PackageSource = (source or installed_package_dir(package)).resolve()
            _copy_tree(src, root / package)
        else:
            src = source
            source.copy_into(root / package)
        (root / ".gitignore").write_text(_GITIGNORE)
        (root / SERVING_FILE).write_text(yaml.safe_dump(serving, sort_keys=True))
        repo = git.Repo.init(root, initial_branch=branch)
        with repo.config_writer() as cw:
            for key, value in _IDENTITY.items():
                section, option = key.split(".")
                cw.set_value(section, option, value)
            cw.set_value("core", "symlinks", "false")
            if not isinstance(src, Path):   # where it came from, for a later reuse to compare (not in the tree)
                cw.set_value("ratchet", "source", str(src))
        repo.git.add("--all")
        repo.git.commit("-q", "-m", f"baseline: {package} from {src}")
        return cls(root=root, package=package)

    @classmethod
    def open(cls, root: Path, package: str = "vllm") -> Workspace:
        root = root.resolve()
        if not (root / ".git").exists():
            raise WorkspaceError(f"{root} is not a ratchet workspace (no .git); create it with `ratchet measure`")
        return cls(root=root, package=package)

    def source_description(self) -> str:
        """What a workspace copied from a `PackageSource` was copied from ("" for a folder of this host)."""
        return str(self.repo.config_reader("repository").get_value("ratchet", "source", ""))

    def head(self) -> str:
        return self.repo.head.commit.hexsha

    def tree_hash(self, ref: str = "HEAD") -> str:
        return self.repo.git.rev_parse(f"{ref}^{{tree}}")

    def content_hash(self) -> str:
        """The git tree hash of the working tree as it is (sources, new files and serving.yaml; ignored
        binaries left out): equal content, equal hash, committed or not. A patched copy's hash is the tree
        hash its commit will have."""
        # A scratch copy of the index: hashing must not stage anything in a user's workspace.
        index = self.root / self.repo.git.rev_parse("--git-path", "index")
        with tempfile.TemporaryDirectory(prefix="ratchet-index-") as tmp:
            scratch = Path(tmp) / "index"
            if index.exists():
                shutil.copy2(index, scratch)
            env = {"GIT_INDEX_FILE": str(scratch)}
            self.repo.git.add("--all", env=env)
            return str(self.repo.git.write_tree(env=env))

    def code_hash(self, ref: str | None = None) -> str:
        """The git tree hash of the code alone: the commit `ref`'s tree, or the working tree as it is (as
        `content_hash`), without serving.yaml. Two builds with equal code hashes run the same code, whatever
        engine args each serves with."""
        index = self.root / self.repo.git.rev_parse("--git-path", "index")
        with tempfile.TemporaryDirectory(prefix="ratchet-index-") as tmp:
            scratch = Path(tmp) / "index"
            env = {"GIT_INDEX_FILE": str(scratch)}
            if ref is not None:
                self.repo.git.read_tree(ref, env=env)
            else:
                if index.exists():
                    shutil.copy2(index, scratch)
                self.repo.git.add("--all", env=env)
            self.repo.git.rm("--cached", "--quiet", "--ignore-unmatch", "--", SERVING_FILE, env=env)
            return str(self.repo.git.write_tree(env=env))

    def resolve(self, ref: str) -> str:
        try:
            return self.repo.git.rev_parse("--verify", f"{ref}^{{commit}}")
        except git.GitCommandError as exc:
            raise WorkspaceError(f"unknown git ref {ref!r} in {self.root}") from exc

    def serving_config(self, ref: str | None = None) -> dict[str, object]:
        text = (self.root / SERVING_FILE).read_text() if ref is None else self.repo.git.show(f"{ref}:{SERVING_FILE}")
        data = yaml.safe_load(text) or {}
        if not isinstance(data, dict):
            raise WorkspaceError(f"{SERVING_FILE} must be a mapping of engine args, got {type(data).__name__}")
        return data

    def is_clean(self) -> bool:
        return not self.repo.is_dirty(untracked_files=True)

    def apply_patch(self, diff: str) -> str:
        """Check and apply a unified diff to the working tree; return the canonical `git diff`."""
        check_patch_paths(diff)
        if not self.is_clean():
            raise WorkspaceError(f"{self.root} has uncommitted changes; reset it before applying a patch")
        self._git_apply(diff, "--check")
        self._git_apply(diff)
        self.repo.git.add("--all")
        return self.repo.git.diff("--cached", "--binary", "HEAD") + "\n"

    def apply_search_replace(self, blocks: str) -> str:
        """Apply SEARCH/REPLACE blocks (sandbox/search_replace.py) through `apply_patch`; return the
        canonical `git diff` of what was applied."""
        from sandbox.search_replace import blocks_to_diff

        if not self.is_clean():
            raise WorkspaceError(f"{self.root} has uncommitted changes; reset it before applying a patch")
        return self.apply_patch(blocks_to_diff(self.root, blocks))

    def _git_apply(self, diff: str, *flags: str) -> None:
        argv = ["git", "apply", "--whitespace=nowarn", *flags, "-"]
        proc = subprocess.run(argv, cwd=self.root, input=diff.encode(), capture_output=True, timeout=60)
        if proc.returncode != 0:
            raise PatchRejected(f"git apply {' '.join(flags)} failed: {proc.stderr.decode(errors='replace').strip()}")

    def commit(self, message: str) -> str:
        self.repo.git.add("--all")
        self.repo.git.commit("-q", "--allow-empty", "-m", message)
        return self.head()

    def commit_object(self, ref: str = "HEAD") -> str:
        """The commit's raw git object (tree, parents, author and committer with their dates, message): recorded in
        the log, it lets another host write the very same commit again (`write_commit`), same hash."""
        proc = subprocess.run(["git", "cat-file", "commit", self.resolve(ref)], cwd=self.root, capture_output=True,
                              timeout=60, check=True)   # byte for byte: the hash covers every byte
        return proc.stdout.decode()

    def write_commit(self, raw: str) -> str:
        """Write a recorded raw commit object into this repository; return its hash. Its tree must be the tree
        the index holds now (checked: a commit over any other tree is refused), and its parents must exist."""
        tree = next((line.split()[1] for line in raw.splitlines() if line.startswith("tree ")), "")
        staged = self.repo.git.write_tree()
        if tree != staged:
            raise WorkspaceError(f"the recorded commit's tree {tree[:12] or '(none)'} is not the tree rebuilt in "
                                 f"{self.root} ({staged[:12]})")
        proc = subprocess.run(["git", "hash-object", "-t", "commit", "-w", "--stdin"], cwd=self.root,
                              input=raw.encode(), capture_output=True, timeout=60)
        if proc.returncode != 0:
            raise WorkspaceError(f"git hash-object of a recorded commit failed: {proc.stderr.decode().strip()}")
        return proc.stdout.decode().strip()

    def reset(self, ref: str = "HEAD") -> None:
        self.repo.git.reset("-q", "--hard", ref)
        self.repo.git.clean("-q", "-fd")

    def checkout_copy(self, ref: str, dest: Path) -> Path:
        """A second tree at `ref` (git worktree, detached) with binaries linked: for A/B side by side."""
        dest = dest.resolve()
        if dest.exists():
            self.repo.git.worktree("remove", "--force", str(dest))
        self.repo.git.worktree("add", "-q", "--detach", str(dest), self.resolve(ref))
        _link_binaries(self.root / self.package, dest / self.package)
        return dest

    def remove_copy(self, dest: Path) -> None:
        self.repo.git.worktree("remove", "--force", str(dest.resolve()))

    def copies(self) -> list[Path]:
        """The trees `checkout_copy` made that git still lists (a killed campaign leaves its candidates' behind)."""
        listed = self.repo.git.worktree("list", "--porcelain").splitlines()
        paths = [Path(line.removeprefix("worktree ")).resolve() for line in listed if line.startswith("worktree ")]
        return [p for p in paths if p != self.root.resolve()]
