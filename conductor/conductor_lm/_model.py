"""``ConductorLM``: the trainable conductor policy, a causal LM with optional LoRA adapters.

One object samples workflows (with the log-probs GRPO needs), scores completions under the current weights, serves
itself to DSPy as a ``dspy.LM``, and saves or loads its adapter.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import threading
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedModel

from conductor.conductor_lm._sampling import (
    LogitsProcessorLike,
    Prompt,
    Sample,
    encode_prompt,
    generate_samples,
    sequence_logprobs,
)
from conductor.conductor_lm._tokenizer import byte_tokenizer
from conductor.errors import ConfigError
from conductor.modules._local import DEFAULT_MODEL, eos_ids, model_folder, model_label

if TYPE_CHECKING:
    import dspy

    from conductor.conductor_lm._engine import ConductorEngine

logger = logging.getLogger(__name__)

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""LoRA targets by default: those of these projections the model has (llama, qwen, gemma, mistral naming)."""

TINY_NAME = "tiny"


@dataclass(frozen=True)
class LoraSpec:
    """LoRA hyper-parameters. ``target_modules=None`` targets every attention and MLP projection in the model.

    Dropout defaults to 0 so that log-probs under training match those under sampling (GRPO's ratio is 1 at the
    first step, not noise).
    """

    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: tuple[str, ...] | None = None

    def resolve(self, model: Any) -> LoraSpec:
        """The spec with ``target_modules`` filled in from ``model``'s linear layers."""
        if self.target_modules is not None:
            return replace(self, target_modules=tuple(self.target_modules))
        output = model.get_output_embeddings()
        linear = {
            name.rsplit(".", 1)[-1]
            for name, module in model.named_modules()
            if isinstance(module, torch.nn.Linear) and module is not output
        }
        found = tuple(p for p in PROJECTIONS if p in linear) or tuple(sorted(linear))
        if not found:
            raise ConfigError(f"{type(model).__name__} has no linear layers for LoRA to target")
        return replace(self, target_modules=found)

    def to_peft(self) -> Any:
        from peft import LoraConfig

        return LoraConfig(
            r=self.r,
            lora_alpha=self.alpha,
            lora_dropout=self.dropout,
            target_modules=list(self.target_modules or ()),
            task_type="CAUSAL_LM",
        )


@contextlib.contextmanager
def quiet_peft() -> Iterator[None]:
    """Hide the FutureWarning peft 0.21 triggers in transformers 5 (``is_gradient_checkpointing``) on every wrap."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        yield


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """A ``torch.dtype`` from itself or its name (``"float32"``, ``"bfloat16"``, ``"float16"``)."""
    resolved = getattr(torch, str(dtype).removeprefix("torch."), None)
    if not isinstance(resolved, torch.dtype) or not resolved.is_floating_point:
        raise ConfigError(f"unknown dtype {dtype!r}: use float32, bfloat16 or float16")
    return resolved


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``device``, else CUDA when available, else CPU."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def base_folder(name_or_path: str | os.PathLike[str]) -> tuple[str, Path]:
    """``(source, folder)``: the normalised model reference and the transformers folder to load it from.

    Reuses ``_local``'s registry and GGUF cache (a GGUF is dequantised once into the cache), but not its loaded-model
    cache: the policy needs its own copy, because peft injects LoRA layers into the model in place and training
    changes weights that local workers share.
    """
    return model_folder(name_or_path)


def load_base(source: str | os.PathLike[str], dtype: torch.dtype) -> tuple[str, Any, Any]:
    """``(source, model, tokenizer)``: a fresh, private copy of a local model or transformers folder."""
    source, folder = base_folder(source)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    return source, model, tokenizer


def _as_lists(ids: Any) -> Any:
    """Tensors and arrays of token ids as (nested) lists of ints; lists and tuples as they are."""
    return ids.tolist() if hasattr(ids, "tolist") else ids


class ConductorLM:
    """The conductor policy: a causal LM (with LoRA adapters unless ``lora=None``) and its tokenizer.

    Args:
        model: a transformers causal LM, or a peft ``PeftModel`` around one.
        tokenizer: its tokenizer; padding is set to the left, and the pad token to EOS when it has none.
        base: what the base weights can be reloaded from (an embedded model name or a folder); ``None`` when they
            can't (a model built in memory), so ``save`` writes them too.
        lora: adds LoRA adapters to a plain model (adapter weights stay float32 whatever the base dtype);
            ``None`` keeps the model as it is (then every weight is trainable, and ``save`` writes all of them).
        name: the model's short name, used in ``conductor/<name>`` as a ``dspy.LM``.
        device: where to run; default CUDA when available, else CPU.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        base: str | None = None,
        lora: LoraSpec | None = LoraSpec(),
        name: str | None = None,
        device: str | torch.device | None = None,
    ):
        from peft import PeftModel, get_peft_model

        self.device = resolve_device(device)
        if isinstance(model, PeftModel):
            config = model.peft_config[model.active_adapter]  # the adapter's own spec wins over ``lora``
            targets = set(config.target_modules)
            ordered = tuple(p for p in PROJECTIONS if p in targets) + tuple(sorted(targets - set(PROJECTIONS)))
            lora = LoraSpec(r=config.r, alpha=config.lora_alpha, dropout=config.lora_dropout, target_modules=ordered)
        elif lora is not None:
            lora = lora.resolve(model)
            # LoRA's A matrices start random: a fixed seed (not the global RNG) makes one spec start one way.
            with quiet_peft(), torch.random.fork_rng(devices=[]):
                torch.manual_seed(0)
                model = get_peft_model(model, lora.to_peft())  # autocast_adapter_dtype: LoRA weights stay float32
        self.model = model.to(self.device)
        self.model.eval()
        self.lora = lora
        self.base = base
        self.name = name or (model_label(base) if base else "custom")
        tokenizer.padding_side = "left"
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids(self.model, tokenizer)
        if not self.eos_ids:
            raise ConfigError("the model has no end-of-sequence token: set generation_config.eos_token_id")
        self.saved_to: Path | None = None
        """The folder this policy was last saved to or loaded from; a saved DSPy program's engine points there."""
        self._lock = threading.Lock()

    # ---- constructors ------------------------------------------------------------------------------------------
    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str | os.PathLike[str] = DEFAULT_MODEL,
        *,
        dtype: str | torch.dtype = "float32",
        lora: LoraSpec | None = LoraSpec(),
        device: str | torch.device | None = None,
    ) -> ConductorLM:
        """A policy from an embedded local model name (see ``EMBEDDED_MODELS``), a transformers folder or a GGUF."""
        source, model, tokenizer = load_base(name_or_path, resolve_dtype(dtype))
        return cls(model, tokenizer, base=source, lora=lora, device=device)

    @classmethod
    def tiny(
        cls,
        seed: int = 0,
        *,
        tokenizer: Any = None,
        hidden_size: int = 64,
        layers: int = 2,
        dtype: str | torch.dtype = "float32",
        lora: LoraSpec | None = LoraSpec(r=4, alpha=8),
        device: str | torch.device | None = "cpu",
    ) -> ConductorLM:
        """A small random-weight llama (about 0.1M parameters) with a byte-level ChatML tokenizer; no download.

        For fast tests of everything but quality. ``tokenizer`` replaces the byte tokenizer (the vocabulary follows).
        """
        tokenizer = tokenizer if tokenizer is not None else byte_tokenizer()
        eos = tokenizer.eos_token_id
        config = LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=hidden_size,
            intermediate_size=hidden_size * 2,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=4096,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=eos,
            pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos,
            tie_word_embeddings=True,
        )
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = LlamaForCausalLM(config).to(resolve_dtype(dtype))
        model.generation_config.eos_token_id = eos
        model.generation_config.pad_token_id = config.pad_token_id
        return cls(model, tokenizer, base=None, lora=lora, name=TINY_NAME, device=device)

    @classmethod
    def load(
        cls, folder: str | os.PathLike[str], *, dtype: str | torch.dtype | None = None, device: str | None = None
    ) -> ConductorLM:
        """Restore a policy written by ``save``; ``dtype`` overrides the saved base dtype."""
        from conductor.conductor_lm._checkpoint import load_policy

        return load_policy(cls, Path(folder), dtype=dtype, device=device)

    # ---- properties --------------------------------------------------------------------------------------------
    @property
    def dtype(self) -> torch.dtype:
        """The base weights' dtype (LoRA weights are float32 regardless)."""
        return self.model.get_input_embeddings().weight.dtype

    @property
    def is_peft(self) -> bool:
        return self.lora is not None

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        """The weights an optimizer should update: the LoRA adapters, or every weight without LoRA."""
        return [p for p in self.model.parameters() if p.requires_grad]

    def train(self, mode: bool = True) -> ConductorLM:
        """Train mode (LoRA dropout on); sampling always runs in eval mode and restores the mode afterwards."""
        self.model.train(mode)
        return self

    def eval(self) -> ConductorLM:
        return self.train(False)

    # ---- tokens ------------------------------------------------------------------------------------------------
    @property
    def pad_id(self) -> int:
        return self.tokenizer.pad_token_id

    def encode(self, prompt: Prompt) -> list[int]:
        """Prompt token ids: raw text as is, chat messages through the chat template (with the generation prompt)."""
        return encode_prompt(self.tokenizer, prompt)

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)

    @property
    def context_window(self) -> int | None:
        return getattr(self.model.config, "max_position_embeddings", None)

    # ---- sampling and scoring ----------------------------------------------------------------------------------
    def sample(
        self,
        prompts: Sequence[Prompt],
        n: int = 1,
        *,
        max_new_tokens: int = 256,
        temperature: float | None = 1.0,
        top_p: float = 1.0,
        seed: int | None = None,
        logits_processor: LogitsProcessorLike | Sequence[LogitsProcessorLike] | None = None,
        stop: Sequence[str] = (),
        batch_size: int | None = None,
    ) -> list[list[Sample]]:
        """``n`` samples per prompt (``result[i][j]``), with per-token log-probs under the sampling policy.

        ``temperature`` 0 or ``None`` is greedy. Thread-safe: calls on one policy run one at a time. Runs in eval
        mode without gradient, seeded with ``seed`` without touching the global RNG state.
        """
        ids = [self.encode(p) for p in prompts]
        with self._lock:
            return generate_samples(
                self.model,
                self.tokenizer,
                ids,
                n,
                eos_ids=self.eos_ids,
                pad_id=self.pad_id,
                max_new_tokens=max_new_tokens,
                temperature=temperature,
                top_p=top_p,
                seed=seed,
                logits_processor=logits_processor,
                stop=stop,
                batch_size=batch_size,
            )

    def sequence_logprobs(
        self,
        prompt_ids: Sequence[int] | Sequence[Sequence[int]],
        completion_ids: Sequence[int] | Sequence[Sequence[int]],
        *,
        grad: bool = False,
        temperature: float = 1.0,
        batch_size: int | None = None,
    ) -> torch.Tensor | list[torch.Tensor]:
        """Per-token log-probs of completions under the current weights: one 1-D tensor for one
        ``(prompt, completion)`` pair of id lists, a list of them for lists of pairs. With ``grad``, the tensors
        carry a graph back to the trainable weights (GRPO's new-policy term)."""
        prompt_ids, completion_ids = _as_lists(prompt_ids), _as_lists(completion_ids)
        single = len(prompt_ids) > 0 and isinstance(prompt_ids[0], int)
        prompts = [prompt_ids] if single else [_as_lists(p) for p in prompt_ids]
        completions = [completion_ids] if single else [_as_lists(c) for c in completion_ids]
        out = sequence_logprobs(
            self.model,
            prompts,  # type: ignore[arg-type]
            completions,  # type: ignore[arg-type]
            pad_id=self.pad_id,
            temperature=temperature,
            grad=grad,
            batch_size=batch_size,
        )
        return out[0] if single else out

    # ---- DSPy --------------------------------------------------------------------------------------------------
    def engine(self, **kwargs: Any) -> ConductorEngine:
        """A DSPy custom engine over this policy (see ``ConductorEngine``)."""
        from conductor.conductor_lm._engine import ConductorEngine

        return ConductorEngine(self, **kwargs)

    def as_dspy_lm(
        self,
        *,
        temperature: float = 0.0,
        max_tokens: int = 512,
        logits_processor: LogitsProcessorLike | Sequence[LogitsProcessorLike] | None = None,
        on_sample: Any = None,
        **lm_kwargs: Any,
    ) -> dspy.LM:
        """This policy as ``dspy.LM("conductor/<name>")``, to pass to ``Conductor`` like any API model.

        ``temperature`` and ``max_tokens`` are the defaults for requests that don't set them (greedy by default);
        ``on_sample(sample)`` sees every ``Sample`` the LM produced (token ids and log-probs, e.g. for RL).
        """
        import dspy

        engine = self.engine(
            temperature=temperature, max_tokens=max_tokens, logits_processor=logits_processor, on_sample=on_sample
        )
        options = {"cache": False, "num_retries": 0, "temperature": temperature, "max_tokens": max_tokens}
        return dspy.LM(f"conductor/{self.name}", engine=engine, **(options | lm_kwargs))

    # ---- weights -----------------------------------------------------------------------------------------------
    def save(self, folder: str | os.PathLike[str]) -> Path:
        """Write the adapter (or the whole model without LoRA), tokenizer and ``conductor_lm.json`` atomically."""
        from conductor.conductor_lm._checkpoint import save_policy

        with self._lock:
            self.saved_to = save_policy(self, Path(folder))
        return self.saved_to

    def merge_adapter(self) -> PreTrainedModel:
        """A plain transformers model with the LoRA weights merged in (in the base dtype); this policy is unchanged.

        For tools that want a plain model (TRL refuses a ``PeftModel`` together with a ``peft_config``). Copies the
        model first, so it briefly needs twice its memory.
        """
        model = copy.deepcopy(self.model)
        if self.lora is not None:
            model = model.merge_and_unload()
        return model

    def base_model(self) -> PreTrainedModel:
        """A copy of the base model without the adapters (unmerged): what ``save`` writes when ``base`` is ``None``."""
        model = copy.deepcopy(self.model)
        return model.unload() if self.lora is not None else model

    def config(self) -> dict[str, Any]:
        """What ``conductor_lm.json`` records."""
        return {
            "name": self.name,
            "base": self.base,
            "dtype": str(self.dtype).removeprefix("torch."),
            "lora": None if self.lora is None else asdict(self.lora),
        }

    def __repr__(self) -> str:
        trainable = sum(p.numel() for p in self.trainable_parameters())
        return (
            f"ConductorLM({self.name!r}, dtype={str(self.dtype).removeprefix('torch.')}, device={self.device}, "
            f"lora={self.lora}, trainable={trainable:,})"
        )
