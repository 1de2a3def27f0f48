"""LoRA adapters over a loaded torch model, with PEFT: many at once, mixed in one forward pass.

A base runtime (torch_model.TorchModel) gets its `LoraLayers` with its first
adapter: PEFT wraps the runtime's transformers model (the one inside a
sentence-transformers model, or the model itself), putting LoRA layers in
place of the Linear modules the adapter targets. The model object is kept,
so the runtime's own forward (sentence-transformers' modules, a
classification head) runs through them unchanged.

An adapter's config and weights are read off the device thread
(`read_adapter`); it is added, and later removed, on the device thread
between two forward batches, so no forward sees the layers change. The last
adapter out unloads PEFT's layers, leaving the base as it was loaded.

Every forward batch of a base with LoRA layers names each input's adapter
(`rows`): PEFT's mixed-batch inference (``adapter_names``: each LoRA layer
computes the base once and adds each adapter's update to its own rows),
``__base__`` for inputs of the base alone. A batch of the base alone runs
with the adapters disabled. PEFT's forward does this inside
``PeftModel.forward``; the runtimes' forwards are not PEFT's, so `rows` enters
the same context PEFT's forward enters (`PeftModel._enable_peft_forward_hooks`,
peft 0.10 to 0.21: pinned in pyproject.toml, held by tests/kinds/test_adapters.py).
"""

from __future__ import annotations

import asyncio
import inspect
import warnings
from collections.abc import Iterator, Sequence
from concurrent.futures import Executor
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import Any

from shoal.configs import AdapterSpec, ModelSpec
from shoal.configs.adapters import BASE_ROWS, PEFT_PREFIX
from shoal.workers.batching.device_thread import DeviceThread

from .torch_model import TorchModel

# The PEFT modules that hold one entry per adapter (`...lora_A.NAME.weight`): an adapter's own parameters.
ADAPTER_OWNERS = {"lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B", "modules_to_save"}


class AdapterMismatch(ValueError):
    """The adapter's weights do not fit the loaded base (names or shapes PEFT could not place)."""


@dataclass
class AdapterWeights:
    """An adapter as read from its folder: PEFT's config and its weights, on the base's device."""

    spec: AdapterSpec
    config: Any  # peft.LoraConfig
    state: dict[str, Any]  # tensor name -> tensor


def read_adapter(spec: AdapterSpec, device: str) -> AdapterWeights:
    """Read an adapter's config and weights (any thread: nothing of the model is touched)."""
    from peft import PeftConfig
    from peft.utils import load_peft_weights

    config = PeftConfig.from_pretrained(spec.source)
    config.inference_mode = True
    state = load_peft_weights(spec.source, device=device)
    # Weights saved by transformers' own adapter support lack PEFT's prefix for the wrapped model.
    state = {key if key.startswith(PEFT_PREFIX) else PEFT_PREFIX + key: value for key, value in state.items()}
    return AdapterWeights(spec, config, state)


class LoraLayers:
    """The adapters loaded over one base runtime's model, by name."""

    def __init__(self, model: Any) -> None:
        """`model`: the runtime's transformers model (its layers are replaced in place)."""
        self.model = model
        self.peft: Any = None  # peft.PeftModel around `model` while any adapter is loaded
        self.bytes: dict[str, int] = {}  # adapter name -> bytes of its weights, as loaded

    @classmethod
    def of(cls, runtime_model: Any) -> LoraLayers:
        """The LoRA layers of a runtime's model: a sentence-transformers model's transformers model, or it."""
        inner = getattr(runtime_model, "transformers_model", None)
        return cls(inner if inner is not None else runtime_model)

    def add(self, weights: AdapterWeights) -> int:
        """Add an adapter (device thread): its measured bytes. AdapterMismatch if PEFT cannot place all of it."""
        from peft import MODEL_TYPE_TO_PEFT_MODEL_MAPPING, PeftModel
        from peft.utils import set_peft_model_state_dict

        name = weights.spec.name
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # PEFT's notes on adapters added for inference only
            if self.peft is None:
                wrapper = MODEL_TYPE_TO_PEFT_MODEL_MAPPING.get(weights.config.task_type, PeftModel)
                self.peft = wrapper(self.model, weights.config, adapter_name=name, autocast_adapter_dtype=False)
            else:
                self.peft.add_adapter(name, weights.config, autocast_adapter_dtype=False)
            self.peft.eval()
            try:
                result: Any = set_peft_model_state_dict(self.peft, weights.state, adapter_name=name)
                own = {key for key, _ in self._parameters(name)}
                missing = sorted(key for key in result.missing_keys if key in own)
                if result.unexpected_keys or missing:
                    raise AdapterMismatch(
                        f"adapter {name!r} ({weights.spec.source}) does not fit base model {weights.spec.base!r}: "
                        f"weights the base has no place for: {sorted(result.unexpected_keys)[:5]}; "
                        f"LoRA weights missing: {missing[:5]}"
                    )
            except Exception:
                self.remove(name)
                raise
        self.bytes[name] = sum(tensor.numel() * tensor.element_size() for _, tensor in self._parameters(name))
        return self.bytes[name]

    def remove(self, name: str) -> None:
        """Remove an adapter (device thread); the last one out unloads PEFT's layers."""
        self.bytes.pop(name, None)
        if self.peft is None or name not in self.peft.peft_config:
            return
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "adapter X was active which is now deleted"
            if len(self.peft.peft_config) == 1:
                self.model = self.peft.unload()
                self.peft = None
            else:
                self.peft.delete_adapter(name)

    def names(self) -> list[str]:
        return list(self.peft.peft_config) if self.peft is not None else []

    def rows(self, names: Sequence[str | None] | None) -> AbstractContextManager[Any]:
        """Around one forward batch: each input through its adapter (None or absent: the base alone)."""
        if self.peft is None:
            return nullcontext()
        adapters = [name or BASE_ROWS for name in names] if names is not None else []
        if all(name == BASE_ROWS for name in adapters):
            return self.peft.disable_adapter()
        return self.peft._enable_peft_forward_hooks(adapter_names=adapters)

    def _parameters(self, name: str) -> Iterator[tuple[str, Any]]:
        """The parameters of one adapter: its LoRA matrices and its own copies of saved modules."""
        for key, tensor in self.peft.named_parameters():
            parts = key.split(".")
            if any(owner in ADAPTER_OWNERS and part == name for owner, part in zip(parts, parts[1:])):
                yield key, tensor


class AdapterRuntime:
    """One adapter over its loaded base, as its model's operations use it: the base's runtime, each call that
    takes per-input `adapters` running every input through this adapter unless told otherwise."""

    def __init__(self, base: Any, spec: ModelSpec) -> None:
        assert spec.adapter is not None
        self.base = base
        self.spec = spec  # the adapter's: its name is BASE+ADAPTER, its window and batching the base's
        self.adapter = spec.adapter.name

    def __getattr__(self, attribute: str) -> Any:
        value = getattr(self.base, attribute)
        if callable(value) and "adapters" in _parameters(value):
            return partial(value, adapters=self.adapter)
        return value


@lru_cache(maxsize=256)
def _parameter_names(function: Any) -> frozenset[str]:
    return frozenset(inspect.signature(function).parameters)


def _parameters(method: Any) -> frozenset[str]:
    """The parameter names of a bound method, read once per function."""
    return _parameter_names(getattr(method, "__func__", method))


def load_adapter_alone(spec: ModelSpec, base: Any) -> AdapterRuntime:
    """`spec`'s adapter over a `base` runtime loaded for it alone (tuning and the quality gate, in one thread)."""
    assert spec.adapter is not None and isinstance(base, TorchModel)
    base.lora = layers = LoraLayers.of(base.model)
    layers.add(read_adapter(spec.adapter, "cpu"))
    return AdapterRuntime(base, spec)


class AdapterLoader:
    """The model pool's hands for adapters: read in an I/O thread, placed on and removed from a base's model on
    the device thread, between two forward batches (and in order: a removal queued before a load runs first)."""

    def __init__(self, device_thread: DeviceThread, executor: Executor) -> None:
        self.device_thread = device_thread
        self.executor = executor

    async def attach(self, base: Any, spec: ModelSpec) -> tuple[AdapterRuntime, int]:
        """`spec`'s adapter over the loaded `base` runtime: its runtime and its measured bytes."""
        assert spec.adapter is not None
        if not isinstance(base, TorchModel):
            raise AdapterMismatch(
                f"model {spec.name!r}: its base {spec.adapter.base!r} is loaded on a runtime without LoRA layers "
                f"({type(base).__name__}); adapters run on torch"
            )
        loop = asyncio.get_running_loop()
        weights = await loop.run_in_executor(self.executor, read_adapter, spec.adapter, "cpu")
        if base.lora is None:
            base.lora = LoraLayers.of(base.model)
        layers = base.lora
        assert isinstance(layers, LoraLayers)
        size = await asyncio.wrap_future(self.device_thread.run_online(partial(layers.add, weights)))
        return AdapterRuntime(base, spec), size

    def detach(self, base: Any, name: str) -> None:
        """Remove adapter `name` from `base`'s model at the device thread's next turn."""
        layers = getattr(base, "lora", None)
        if isinstance(layers, LoraLayers):
            self.device_thread.run_online(partial(layers.remove, name))
