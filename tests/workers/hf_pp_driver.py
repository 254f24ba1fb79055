"""torchrun script (not a test module): the `hf` family under `pp` at 2 ranks, as it is and with
a wrong stage boundary, against `single` (launched by test_hf_pipeline.py).

The tiny Llama of hf_driver.py through the same case runner (`main.new_model`, the strategy, the
gradient check's own code, the shared training loop, held against the fp32 `single` reference).
Broken on purpose: a family that declares the final norm with the first stage's roots
(`NormOnFirstStage`), so stage 0 normalises the residual stream it sends and the last stage feeds
the head an unnormalised one. It trains; the checks must see it.

Everything goes to --out as JSON from rank 0.
"""

from __future__ import annotations

from typing import Any

from parallab.core.families.hf import HFFamily
from tests.workers.driver_context import family_reference, finish, start
from tests.workers.hf_driver import HF_WORKLOAD, run_broken, run_case


class NormOnFirstStage(HFFamily):
    """A wrong stage boundary: model.norm goes with the embedding rather than with the head."""

    first_stage = ("model.embed_tokens", "model.norm")
    last_stage = ("lm_head",)


def main() -> None:
    out = start()
    reference = family_reference(HF_WORKLOAD)
    results: dict[str, Any] = {
        "pp": run_case("pp", {}, reference),
        "pp_norm_on_first_stage": run_broken("pp", NormOnFirstStage(), reference),
    }
    finish(results, out)


if __name__ == "__main__":
    main()
