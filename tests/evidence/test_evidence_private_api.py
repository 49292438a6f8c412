"""The private torch APIs the collector patches or reads: fail loudly when one disappears,
and check that the fake-CUDA patches are undone."""

import torch

from trainbridge.evidence import fake_cuda, inductor_hooks


def test_no_private_api_has_disappeared():
    missing = fake_cuda.missing_private_apis() + inductor_hooks.missing_private_apis()
    assert not missing, (f"torch {torch.__version__} lacks private APIs the evidence collector needs "
                         f"(checked on {fake_cuda.CHECKED_ON}): {missing}")


def test_every_patch_names_its_reason():
    assert len(fake_cuda.PATCHES) >= 10
    assert all(p.why for p in fake_cuda.PATCHES)


def test_fake_cuda_device_restores_everything():
    from torch._dynamo.device_interface import get_interface_for_device
    from torch._inductor.runtime.hints import DeviceProperties

    ci = get_interface_for_device("cuda")
    before = (torch.cuda.is_available, torch.cuda.get_device_capability, torch.Tensor.__invert__,
              torch.Tensor.copy_, vars(ci)["is_available"], vars(DeviceProperties)["create"],
              torch.utils._triton.has_triton, torch._inductor.compile_fx.get_cuda_device_context)
    real = torch.cuda.is_available()
    with fake_cuda.fake_cuda_device():
        assert torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
        assert ci.is_available() and torch.utils._triton.has_triton()
        props = DeviceProperties.create(torch.device("cuda", 0))
        assert props.multi_processor_count == 132 and props.cc == 90
        assert (~torch.tensor([True])).tolist() == [False]
    after = (torch.cuda.is_available, torch.cuda.get_device_capability, torch.Tensor.__invert__,
             torch.Tensor.copy_, vars(ci)["is_available"], vars(DeviceProperties)["create"],
             torch.utils._triton.has_triton, torch._inductor.compile_fx.get_cuda_device_context)
    assert before == after and torch.cuda.is_available() == real
    assert "__invert__" not in vars(torch.Tensor) or before[2] is after[2]


def test_collector_config_restores():
    import torch._functorch.config as fc
    import torch._inductor.config as ic

    before = (ic.fx_graph_cache, ic.compile_threads, ic.post_grad_custom_post_pass,
              ic.trace.provenance_tracking_level, fc.enable_autograd_cache, fc.force_non_lazy_backward_lowering)
    with inductor_hooks.collector_config(lambda g: None):
        assert ic.fx_graph_cache is False and fc.force_non_lazy_backward_lowering is True
        assert ic.trace.provenance_tracking_level == 1 and ic.post_grad_custom_post_pass is not None
    after = (ic.fx_graph_cache, ic.compile_threads, ic.post_grad_custom_post_pass,
             ic.trace.provenance_tracking_level, fc.enable_autograd_cache, fc.force_non_lazy_backward_lowering)
    assert before == after
