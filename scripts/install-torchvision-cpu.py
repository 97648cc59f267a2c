"""Give the embedded CPU venv a torchvision that imports, so vLLM's Gemma 4 multimodal processor can run.

    .venv/bin/python scripts/install-torchvision-cpu.py            (setup.sh runs it)

Gemma 4's image processor (transformers) imports torchvision.transforms.v2 and resizes, rescales and
patchifies with plain torch ops. PyPI's torchvision wheels are CUDA builds: their C extensions (`_C.so`,
`image.so`) link libtorch_cuda, which the +cpu torch lacks, and PyTorch's CPU index is not reachable from
offline hosts. So this installs the PyPI wheel pinned below (the release for torch 2.13) without its C
extensions. torchvision's own loader treats a missing `_C` as "no compiled ops" (detection ops such as nms
then raise when called; nothing in the Gemma 4 path calls them). One upstream bug stops that from importing:
`_meta_registrations.py` registers fake kernels for `torchvision::nms`/`qnms` without the `_has_ops()` guard
its other registrations have. The fix below adds that guard and nothing else, and refuses to run if the file
is not the text it expects.

A host that can reach download.pytorch.org installs `torchvision==<pin>+cpu` instead (sandbox/images/
Dockerfile.cpu). torchvision is no requirement of ratchet's (pyproject.toml): a GPU host's vLLM environment
brings its own.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

VERSION = "0.28.0"     # torchvision's release for torch 2.13.0 (constraints.txt); Dockerfile.cpu's TORCHVISION_VERSION
UNGUARDED = ('@torch.library.register_fake("torchvision::nms")', '@torch.library.register_fake("torchvision::qnms")')


def guard(source: str) -> str:
    for decorator in UNGUARDED:
        if source.count(decorator) != 1:
            raise SystemExit(f"install-torchvision-cpu: expected one `{decorator}` in _meta_registrations.py")
        op = decorator.split('"')[1]
        source = source.replace(
            decorator,
            f'@(torch.library.register_fake("{op}") if torchvision.extension._has_ops() else (lambda fn: fn))',
        )
    return source


def main() -> None:
    version = VERSION
    pip = [sys.executable, "-m", "pip"]
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([*pip, "download", "-q", "--no-deps", "--only-binary=:all:", "-d", tmp,
                        f"torchvision=={version}"], check=True)
        wheel = next(Path(tmp).glob("torchvision-*.whl"))
        subprocess.run([*pip, "install", "-q", "--no-deps", "--force-reinstall", str(wheel)], check=True)
    import importlib.util

    spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.origin is None:
        raise SystemExit("install-torchvision-cpu: torchvision did not install")
    pkg = Path(spec.origin).parent
    for ext in sorted(pkg.glob("*.so")):
        ext.unlink()  # CUDA-linked: cannot load next to the +cpu torch
    meta = pkg / "_meta_registrations.py"
    meta.write_text(guard(meta.read_text()))
    for stale in pkg.glob("__pycache__/_meta_registrations*.pyc"):
        stale.unlink()
    subprocess.run([sys.executable, "-c",
                    "import torchvision, transformers.models.gemma4.processing_gemma4 as p; "
                    "print('install-torchvision-cpu: torchvision', torchvision.__version__, '(no C ops),', "
                    "'Gemma4Processor importable:', hasattr(p, 'Gemma4Processor'))"], check=True)


if __name__ == "__main__":
    main()
