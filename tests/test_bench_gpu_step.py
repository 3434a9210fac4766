"""bench.gpu_step's accounting (kernel kinds, GPU busy time, per-step figures) and the batches the
GPU benchmarks draw, checked on the CPU: the profile itself needs a GPU."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bench import gpu_step

# Kernel names as torch 2.11 + CUDA 13 print them on an H100 (abridged templates).
NAMES = {
    "nvjet_tst_128x256_64x4_2x1_v_bz_coopA_NTN": "matrix products (cuBLAS, CUTLASS)",
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1": "matrix products (cuBLAS, CUTLASS)",  # noqa: E501
    "fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<...>)": "attention (SDPA kernels, softmax, masks)",  # noqa: E501
    "void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<...>": "attention (SDPA kernels, softmax, masks)",  # noqa: E501
    "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>": "norms (LayerNorm forward and backward)",  # noqa: E501
    "void at::native::multi_tensor_apply_kernel<at::native::FusedAdamMathFunctor<float, 4>>": "optimizer and clipping (fused AdamW, grad norm)",  # noqa: E501
    "void at::native::lpnorm_cleanup<float, (at::native::NormType)1, float, float>": "optimizer and clipping (fused AdamW, grad norm)",  # noqa: E501
    "void at::native::(anonymous namespace)::fused_dropout_kernel_vec<c10::BFloat16, float>": "dropout",
    "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(...)>": "casts (fp32 <-> bf16)",  # noqa: E501
    "void at::native::embedding_backward_feature_kernel<float, float, long>": "embedding gradient",
    "Memcpy HtoD (Pageable -> Device)": "copies (host <-> device, memset)",
    "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(...)>": gpu_step.OTHER,
}


@pytest.mark.parametrize("name", NAMES)
def test_kernel_kinds(name: str) -> None:
    assert gpu_step.kernel_kind(name) == NAMES[name]


def test_busy_time_is_the_union_of_the_kernels_intervals() -> None:
    assert gpu_step.busy_us([]) == 0
    assert gpu_step.busy_us([(0, 10), (5, 12), (20, 25), (21, 22)]) == 17  # overlap counted once
    assert gpu_step.busy_us([(20, 25), (0, 10)]) == 15  # any order


def test_summary_per_step_idle_share_launches_and_syncs() -> None:
    kernels = [("nvjet_gemm", 0, 600), ("fmha_cutlassF", 600, 800), ("gelu", 1000, 1100)] * 2
    host = ["cudaLaunchKernel"] * 6 + ["aten::_local_scalar_dense", "cudaStreamSynchronize", "aten::mm"]
    out = gpu_step.summarize(kernels, host, steps=2, wall_ms=4.0)
    assert out["wall_ms_per_step"] == 2.0
    assert out["gpu_busy_ms_per_step"] == 0.45  # the repeated intervals overlap: 900 us in all
    assert out["gpu_idle_share"] == pytest.approx(1 - 0.9 / 4.0, abs=1e-3)
    assert out["kernel_ms_per_step_by_kind"] == {
        "matrix products (cuBLAS, CUTLASS)": 0.6,
        "attention (SDPA kernels, softmax, masks)": 0.2,
        gpu_step.OTHER: 0.1,
    }
    assert (out["kernels_per_step"], out["launches_per_step"], out["host_syncs_per_step"]) == (3, 3, 1)


def test_rungs_are_batch_and_precision_pairs() -> None:
    assert gpu_step.parse_rungs("64:bf16,12:fp32:graphs") == [(64, "bf16", False), (12, "fp32", True)]
    for bad in ("64", "x:bf16", "0:fp32", "64:int8", "64:bf16:compile", "12:fp16:graphs"):
        with pytest.raises(SystemExit, match="BATCH:PRECISION"):
            gpu_step.parse_rungs(bad)


def test_large_batches_of_a_small_file_cycle_through_its_windows(tmp_path: Path) -> None:
    """128 windows per step x 10 steps from a file of 982 windows: no window is drawn a second
    time before every one has been drawn once -- what the 128-per-GPU rungs time."""
    from bench import throughput
    from bench.common import window_sample

    sample = window_sample(982, 1280)
    assert len(sample) == 1280 and sorted(sample[:982]) == list(range(982))
    assert np.bincount(sample).max() == 2 and len(set(sample[982:])) == 1280 - 982
    assert list(window_sample(982, 100)) == list(sample[:100])  # the same draw, however many
    args = throughput.parse_args(["--device", "cpu", "--skip-trial"])
    setup = throughput.Setup.build(args, tmp_path)
    assert len(setup.features) == 982
    batches, collate_ms = gpu_step.rung_batches(setup, 128, 10)
    assert sum(len(b["input_ids"]) for b in batches) == 1280 and collate_ms > 0


def test_gpu_step_refuses_a_machine_without_cuda() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here")
    with pytest.raises(SystemExit):
        gpu_step.main(["--batches", "1"])


def test_graphs_rung_needs_cuda() -> None:
    from bench import throughput

    with pytest.raises(SystemExit):
        throughput.parse_args(["--device", "cpu", "--graphs", "--skip-trial"])
    assert not throughput.parse_args(["--device", "cpu", "--skip-trial"]).graphs


def test_the_gpu_timelines_labelled_ranges_are_not_counted_as_kernels() -> None:
    """On a GPU profile, record_function ranges ("forward", the optimizer's step) appear on the
    device timeline too, spanning many kernels; counted as kernels they made the element-wise
    share 80 % of the step on an H100. Only kernels and copies are kept."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    def event(name: str, device: DeviceType) -> SimpleNamespace:
        return SimpleNamespace(name=name, device_type=device)

    events = [
        event("forward", DeviceType.CPU),
        event("aten::addmm", DeviceType.CPU),
        event("Optimizer.step#AdamW.step", DeviceType.CPU),
        event("forward", DeviceType.CUDA),  # the range, on the GPU's timeline
        event("Optimizer.step#AdamW.step", DeviceType.CUDA),
        event("nvjet_tst_128x256_64x4_2x1_v_bz_coopA_NTN", DeviceType.CUDA),
        event("Memcpy HtoD (Pageable -> Device)", DeviceType.CUDA),
    ]
    host, device = gpu_step.split_events(events)
    assert host == ["forward", "aten::addmm", "Optimizer.step#AdamW.step"]
    assert [e.name for e in device] == [
        "nvjet_tst_128x256_64x4_2x1_v_bz_coopA_NTN",
        "Memcpy HtoD (Pageable -> Device)",
    ]
