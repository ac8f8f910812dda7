"""``ConductorLM``: the trainable conductor policy, a causal LM with optional LoRA adapters.

It is a ``conductor.local.LocalModel`` with weights of its own: it samples workflows (with the log-probs GRPO needs)
and scores completions through the one local generation stack, serves itself to DSPy through the one local engine,
and adds what training needs: LoRA, trainable parameters, save and load.
"""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel

from conductor.conductor_lm._base import load_base, quiet_peft
from conductor.conductor_lm._checkpoint import load_policy, save_policy
from conductor.conductor_lm._tokenizer import byte_tokenizer
from conductor.errors import ConfigError
from conductor.local import (
    DEFAULT_MODEL,
    LocalEngine,
    LocalModel,
    LogitsProcessorLike,
    Sample,
    local_lm,
    model_label,
    resolve_dtype,
)

if TYPE_CHECKING:
    import dspy

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


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``device``, else CUDA when available, else CPU."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


class ConductorLM(LocalModel):
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
        sampling_dtype: sample from a copy of the model in this dtype (e.g. ``"bfloat16"`` under a float32 base);
            ``None`` or the base dtype samples from the model itself. See ``sampling_model``.
    """

    trainable = True

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        base: str | None = None,
        lora: LoraSpec | None = LoraSpec(),
        name: str | None = None,
        device: str | torch.device | None = None,
        sampling_dtype: str | torch.dtype | None = None,
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
        model = model.to(self.device)
        model.eval()
        tokenizer.padding_side = "left"
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        super().__init__(model, tokenizer, name=name or (model_label(base) if base else "custom"))
        self.lora = lora
        self.base = base
        self.saved_to: Path | None = None
        """The folder this policy was last saved to or loaded from; a saved DSPy program's engine points there."""
        sampling = None if sampling_dtype is None else resolve_dtype(sampling_dtype)
        self.sampling_dtype: torch.dtype | None = None if sampling == self.dtype else sampling
        self._sampler: PreTrainedModel | None = None
        self._sampled_weights: list[torch.Tensor] = []  # the trainable weights the copy was last brought up to

    # ---- constructors ------------------------------------------------------------------------------------------
    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str | os.PathLike[str] = DEFAULT_MODEL,
        *,
        dtype: str | torch.dtype = "float32",
        lora: LoraSpec | None = LoraSpec(),
        device: str | torch.device | None = None,
        sampling_dtype: str | torch.dtype | None = None,
    ) -> ConductorLM:
        """A policy from an embedded local model name (see ``conductor.local.EMBEDDED_MODELS``), a transformers
        folder or a GGUF."""
        source, model, tokenizer = load_base(name_or_path, resolve_dtype(dtype))
        return cls(model, tokenizer, base=source, lora=lora, device=device, sampling_dtype=sampling_dtype)

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
        sampling_dtype: str | torch.dtype | None = None,
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
        return cls(model, tokenizer, base=None, lora=lora, name=TINY_NAME, device=device, sampling_dtype=sampling_dtype)

    @classmethod
    def load(
        cls,
        folder: str | os.PathLike[str],
        *,
        dtype: str | torch.dtype | None = None,
        device: str | None = None,
        sampling_dtype: str | torch.dtype | None = None,
    ) -> ConductorLM:
        """Restore a policy written by ``save``; ``dtype`` overrides the saved base dtype."""
        return load_policy(cls, Path(folder), dtype=dtype, device=device, sampling_dtype=sampling_dtype)

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

    def trainable_state(self) -> list[torch.Tensor]:
        """A copy of the trainable weights, to put back with ``restore_trainable_state`` (say, after a training
        phase that did not help)."""
        return [p.detach().clone() for p in self.trainable_parameters()]

    @torch.no_grad()
    def restore_trainable_state(self, state: Sequence[torch.Tensor]) -> None:
        """Put back trainable weights copied by ``trainable_state``."""
        for param, saved in zip(self.trainable_parameters(), state, strict=True):
            param.copy_(saved)

    # ---- sampling in another dtype -----------------------------------------------------------------------------
    def sampling_model(self) -> Any:
        """The model ``sample`` generates with: the policy itself, or with ``sampling_dtype`` a plain copy of it in
        that dtype holding the current weights (LoRA merged in: ``base + B @ A * scale``, rounded once).

        The copy follows training by itself: before each sampling call the trainable weights are compared with those
        of the last refresh (kept for that: the LoRA weights, or every weight without LoRA), and the copy is brought
        up to date when one differs (an optimizer step, a checkpoint loaded). Comparing the values, not torch's
        version counters, catches fused optimizers too, which don't bump them; it costs a pass over the adapter,
        little next to generation. The learner keeps its dtype (float32 adapters, optimizer state and new-policy
        log-probs); only sampling, and the log-probs a ``Sample`` records, use the copy.

        When that is sound: the tokens then come from a policy that differs from the learner's by rounding, so
        GRPO's importance ratio ``exp(logp_learner - logp_sampler)`` is not exactly 1 even before an update. It is
        sound where those ratios stay well inside the clip range (``benchmarks/sampling_dtype.py`` measures them for
        SmolLM2; see ``docs/gpu_recipe.md``); a trainer that uses the learner's own detached log-probs as the old
        ones (one update per batch) ignores the mismatch, and one that takes the old log-probs from the ``Sample``
        clips it. The copy costs the model's memory again in ``sampling_dtype`` (a 7B model: about 15 GB in bf16),
        and making it briefly a full copy in the base dtype.
        """
        if self.sampling_dtype is None:
            return self.model
        weights = self.trainable_parameters()
        synced = self._sampled_weights
        if self._sampler is None or len(weights) != len(synced) or not all(map(torch.equal, weights, synced)):
            self._sync_sampler()
            self._sampled_weights = [w.detach().clone() for w in weights]
        return self._sampler

    @torch.no_grad()
    def _sync_sampler(self) -> None:
        """Create the sampling copy (frozen weights once) and write the current trainable weights into it."""
        if self._sampler is None:
            self._sampler = self.base_model().to(self.sampling_dtype).eval().requires_grad_(False)
        if self.lora is None:
            self._sampler.load_state_dict(self.model.state_dict())  # every weight is trainable
            return
        from peft.tuners.lora import LoraLayer

        adapter = self.model.active_adapter
        for name, module in self.model.get_base_model().named_modules():
            if isinstance(module, LoraLayer):
                merged = module.get_base_layer().weight + module.get_delta_weight(adapter)
                self._sampler.get_submodule(name).weight.copy_(merged)

    def train(self, mode: bool = True) -> ConductorLM:
        """Train mode (LoRA dropout on); sampling always runs in eval mode and restores the mode afterwards."""
        self.model.train(mode)
        return self

    def eval(self) -> ConductorLM:
        return self.train(False)

    # ---- DSPy --------------------------------------------------------------------------------------------------
    def engine(self, **kwargs: Any) -> LocalEngine:
        """The DSPy custom engine over this policy (``LocalEngine``: ``temperature``, ``max_tokens``,
        ``logits_processor``, ``on_sample``)."""
        return LocalEngine(self, **kwargs)

    def as_dspy_lm(
        self,
        *,
        temperature: float = 0.0,
        max_tokens: int = 512,
        logits_processor: LogitsProcessorLike | Sequence[LogitsProcessorLike] | None = None,
        on_sample: Callable[[Sample], None] | None = None,
        **lm_kwargs: Any,
    ) -> dspy.LM:
        """This policy as ``dspy.LM("conductor/<name>")``, to pass to ``Conductor`` like any API model.

        ``temperature`` and ``max_tokens`` are the defaults for requests that don't set them (greedy by default);
        ``logits_processor`` constrains every completion (e.g. ``constrain_for``'s workflow grammar);
        ``on_sample(sample)`` sees every ``Sample`` the LM produced (token ids and log-probs, e.g. for RL).
        """
        return local_lm(
            self,
            temperature=temperature,
            max_tokens=max_tokens,
            logits_processor=logits_processor,
            on_sample=on_sample,
            **lm_kwargs,
        )

    # ---- weights -----------------------------------------------------------------------------------------------
    def save(self, folder: str | os.PathLike[str]) -> Path:
        """Write the adapter (or the whole model without LoRA), tokenizer and ``conductor_lm.json`` atomically."""
        with self.lock:
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
        sampling = (
            "" if self.sampling_dtype is None else f", sampling_dtype={str(self.sampling_dtype).removeprefix('torch.')}"
        )
        return (
            f"ConductorLM({self.name!r}, dtype={str(self.dtype).removeprefix('torch.')}{sampling}, "
            f"device={self.device}, lora={self.lora}, trainable={trainable:,})"
        )
