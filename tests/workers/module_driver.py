"""torchrun script (not a test module): the `module` family — the shipped example
`examples.lab_model:build` — under ddp, fsdp and tp (the spec's own plan) against `single`, and a
module that keeps a stored head count (`lab_builds.stores_its_head_count`) under tp, which must fail.

Launched once by test_module_family.py at 2 ranks on `tiny`'s shape with 2 layers. Each case runs
what a run checks (`driver_context.family_case`: the gradient check's own code and the shared
training loop against the fp32 `single` reference of its own workload); rank 0 also counts the
built module's parameters. Everything goes to --out as JSON from rank 0.
"""

from __future__ import annotations

from typing import Any

from tests.workers.driver_context import family_case, family_reference, finish, start

MODULE_WORKLOAD: dict[str, Any] = {"family": "module", "module": "examples.lab_model:build", "num_layers": 2}
STORED_HEADS_WORKLOAD: dict[str, Any] = {**MODULE_WORKLOAD, "module": "tests.workers.lab_builds:stores_its_head_count"}
CASES: dict[str, tuple[str, dict[str, Any]]] = {"ddp": ("ddp", {}), "fsdp": ("fsdp", {}), "tp": ("tp", {})}


def main() -> None:
    out = start()
    reference = family_reference(MODULE_WORKLOAD)
    results: dict[str, Any] = {case: family_case(MODULE_WORKLOAD, name, options, reference) for case, (name, options) in CASES.items()}
    results["tp-stored-heads"] = family_case(STORED_HEADS_WORKLOAD, "tp", {}, family_reference(STORED_HEADS_WORKLOAD))
    if reference is not None:
        results["reference_params"] = reference["params"]
    finish(results, out)


if __name__ == "__main__":
    main()
