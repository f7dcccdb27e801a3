"""The boots the pipeline compares, as one type: every outward name of a boot derives from it."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path


class Boot(StrEnum):
    """The three boots the capacity stage compares, by role. The values key them in report.json
    (``configs[].name``), artifacts and benchmark results.

    The values are the names results have always carried (a candidate of any scheme, FP8 or INT8 too, has
    its 16-bit-KV boot under "w4a16"); :meth:`label` names a boot by what ran (the scheme and KV dtype)
    for people and files: the capacity table's rows and the run folder's ``vllm-<label>.log``
    (:meth:`log_name`)."""

    BASE = "base"  # the base model, 16-bit KV
    QUANTIZED_16BIT_KV = "w4a16"  # the quantized checkpoint, 16-bit KV
    PRODUCTION = "w4a16-fp8kv"  # the quantized checkpoint, the recipe's KV dtype: the boot the gates prove

    @property
    def quantized(self) -> bool:
        return self is not Boot.BASE

    @property
    def sixteen_bit_kv(self) -> bool:
        return self is not Boot.PRODUCTION

    def label(self, scheme: str | None = None, *, kv_cache_dtype: str | None = None) -> str:
        """The boot's name where people read it (the capacity table, the boot log): its value, with a
        quantized boot's "w4a16" replaced by the candidate's scheme when that is another family, so an INT8
        W8A8 candidate's rows read "w8a8" and "w8a8-fp8kv"; and the production boot's "fp8kv" by "16bitkv"
        when ``kv_cache_dtype`` (given) is no fp8 one ("auto", "bfloat16"). Results keep the value."""
        name = self.value
        if self is Boot.PRODUCTION and kv_cache_dtype is not None and not kv_cache_dtype.startswith("fp8"):
            name = name.replace("-fp8kv", "-16bitkv")
        if not self.quantized or not scheme or scheme.upper().startswith("W4A16"):
            return name
        return name.replace("w4a16", scheme.lower(), 1)

    def log_name(
        self, scheme: str | None = None, *, kv_cache_dtype: str | None = None, kind: str = ""
    ) -> str:
        """The file a boot of this role logs to, named by what ran (:meth:`label`): ``vllm-w8a8-16bitkv.log``
        for the production boot of an INT8 W8A8 run with a 16-bit KV cache. ``kind``: a boot of another kind
        ("shape": dummy weights)."""
        return f"vllm-{kind + '-' if kind else ''}{self.label(scheme, kv_cache_dtype=kv_cache_dtype)}.log"

    def model_dir(self, base_dir: str | Path, checkpoint_dir: str | Path) -> Path:
        """The folder this boot serves: the base model's or the quantized checkpoint's."""
        return Path(checkpoint_dir if self.quantized else base_dir)
