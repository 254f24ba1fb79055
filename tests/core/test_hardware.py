"""The device rule for precisions, the hardware catalogue and a calibrated profile's look-ups."""

from __future__ import annotations

import json

import pytest

from parallab.core.hardware import (
    BusbwPoint,
    DeviceDescription,
    HardwareProfile,
    MatmulPoint,
    load_catalogue,
    precision_problem,
    read_catalogue_file,
)

CPU = DeviceDescription(kind="cpu", name="Intel(R) Xeon(R) Processor")
A100 = DeviceDescription(kind="cuda", name="NVIDIA A100-SXM4-80GB", capability=(8, 0))
H100 = DeviceDescription(kind="cuda", name="NVIDIA H100 80GB HBM3", capability=(9, 0))
V100 = DeviceDescription(kind="cuda", name="Tesla V100-SXM2-32GB", capability=(7, 0))


@pytest.mark.parametrize(
    ("precision", "device", "says"),
    [
        ("fp8", CPU, "no CUDA device here (Intel(R) Xeon(R) Processor)"),
        ("fp8", A100, "NVIDIA A100-SXM4-80GB has compute capability 8.0"),
        ("fp8", DeviceDescription(kind="rocm", name="AMD Instinct MI300X"), "is a ROCm device"),
        ("bf16", V100, "Tesla V100-SXM2-32GB has 7.0"),
    ],
)
def test_a_device_that_cannot_train_in_a_precision_says_why_in_its_own_words(precision, device, says):
    problem = precision_problem(precision, device)
    assert problem is not None and says in problem and precision in problem


@pytest.mark.parametrize(("precision", "device"), [("fp8", H100), ("bf16", A100), ("bf16", CPU), ("fp16", CPU), ("fp32", V100)])
def test_devices_that_can_train_in_a_precision_pass(precision, device):
    assert precision_problem(precision, device) is None


def test_every_catalogue_figure_says_where_it_comes_from():
    catalogue = load_catalogue()
    assert {"a100-40gb", "a100-80gb", "h100-sxm", "h100-pcie", "h200", "b200", "mi300x", "cpu"} <= {d.key for d in catalogue.devices}
    for device in catalogue.devices:
        for figure in ("flops", "memory_bytes", "memory_bandwidth", "intra_node_bandwidth", "inter_node_bandwidth"):
            assert device.sources.get(figure), f"{device.key}.{figure} has no source"
        assert device.flops["bf16"] > device.flops["fp32"] > 0
        if device.kind == "cuda":
            assert device.capability is not None


def test_devices_are_found_by_alias_and_by_the_name_torch_reports():
    catalogue = load_catalogue()
    assert catalogue.get("H100").key == "h100-sxm"
    assert catalogue.for_device("NVIDIA H100 PCIe", "cuda").key == "h100-pcie"
    assert catalogue.for_device("NVIDIA H100 80GB HBM3", "cuda").key == "h100-sxm"
    assert catalogue.for_device("some CPU", "cpu").key == "cpu"
    assert catalogue.for_device("NVIDIA GeForce RTX 3090", "cuda") is None
    with pytest.raises(KeyError, match="unknown device 'h900'; known: a100-40gb"):
        catalogue.get("h900")


def test_a_labs_file_adds_devices_and_overrides_by_key(tmp_path):
    base = load_catalogue()
    mine = base.get("h100-sxm").model_copy(update={"inter_node_bandwidth": 100e9, "sources": {"inter_node_bandwidth": "our NICs"}})
    extra = {"devices": [mine.model_dump(), {**base.get("cpu").model_dump(), "key": "lab-cpu", "aliases": ["lab"]}]}
    path = tmp_path / "catalogue.json"
    path.write_text(json.dumps(extra))
    merged = load_catalogue(path)
    assert merged.get("h100").inter_node_bandwidth == 100e9
    assert merged.get("lab").key == "lab-cpu"
    assert len(merged.devices) == len(base.devices) + 1
    path.write_text('{"devices": [{"key": "x"}]}')
    with pytest.raises(ValueError, match="hardware catalogue .*catalogue.json"):
        read_catalogue_file(path)


def test_a_profile_interpolates_in_log_size_and_is_flat_beyond_its_ends():
    profile = HardwareProfile(
        device=CPU,
        world_size=2,
        matmul=[MatmulPoint(precision="fp32", m=m, n=256, k=256, flops_per_s=f) for m, f in ((64, 1e9), (4096, 4e9))],
        collectives=[BusbwPoint(op="all_reduce", size_bytes=s, busbw_gbps=b, time_s=1e-3) for s, b in ((1024, 0.1), (1 << 20, 1.0))],
    )
    middle = profile.matmul_flops("fp32", 512, 256, 256)
    assert 1e9 < middle < 4e9
    assert middle == pytest.approx(1e9 + 3e9 * 0.5)  # 512 is halfway from 64 to 4096 in log(m·n·k)
    assert profile.matmul_flops("fp32", 1, 1, 1) == 1e9 and profile.matmul_flops("fp32", 1 << 20, 256, 256) == 4e9
    assert profile.matmul_flops("bf16", 64, 256, 256) is None
    assert profile.busbw("all_reduce", 1 << 30) == pytest.approx(1e9)
    assert profile.busbw("all_gather", 1024) is None
