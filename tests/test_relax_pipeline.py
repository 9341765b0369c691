"""umahub inside ``tvm.compile``: ``relax_pipeline=hub.relax_pipeline()`` and ``"umahub"``."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
import tvm
from conftest import host_reference
from tvm import relax

import umahub
import umahub.models as zoo

THREE = {
    "plugins": ["npu", "vanilla", "dsp"],
    "priority": ["npu", "vanilla_accel", "dsp_cpu"],
    "placement": {"conv1_relu": "dsp_cpu:1"},
}


def _rows(report):
    return [(o.name, o.device, o.pattern, o.pinned) for o in report.placement]


@pytest.fixture(scope="module")
def three():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the broken test plugins installed beside
        hub = umahub.Hub(config=THREE, project_config=False)
    return hub, hub.compile(zoo.get("cnn"))


def test_tvm_compile_with_the_pipeline_places_and_computes_as_hub_compile(three):
    hub, reference = three
    pipeline = hub.relax_pipeline()
    executable = tvm.compile(zoo.get("cnn"), target="llvm", relax_pipeline=pipeline)
    assert _rows(pipeline.report) == _rows(reference.report)
    assert [p.virtual_device for p in pipeline.report.partitions] == [
        p.virtual_device for p in reference.report.partitions
    ]
    compiled = pipeline.load(executable)
    inputs = zoo.inputs("cnn")
    np.testing.assert_array_equal(compiled.run(*inputs), reference.run(*inputs))
    np.testing.assert_allclose(compiled.run(*inputs), host_reference("cnn"), rtol=1e-5, atol=1e-5)
    # The weights stay the model's: copied at every inference, not lifted into main.
    assert [c for c in pipeline.report.copies if c.when == "load"] == []
    assert compiled.report.devices == ["host", "npu:0", "vanilla_accel:0", "dsp_cpu:1"]


THREE_TOML = """[tool.umahub]
plugins = ["npu", "vanilla", "dsp"]
priority = ["npu", "vanilla_accel", "dsp_cpu"]
placement = { conv1_relu = "dsp_cpu:1" }
"""


def _tvm_vm(library):
    vm = relax.VirtualMachine(library, tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(x) for x in zoo.inputs("cnn")]).numpy()


def _partitions_called(executable):
    """The accelerators' partitions an executable of the cnn calls, by symbol."""
    return sorted(set(re.findall(r"(?:npu|vanilla_accel|dsp_cpu)_\d+_\w+", executable.as_text())))


def test_tvm_compile_by_name_works_with_tvms_own_vm_and_export(isolated):
    # All three bundled plugins: the vanilla's C kernels with their header and
    # library, the npu's LLVM, the dsp's second instance; one device, tvm.cpu().
    (isolated / "pyproject.toml").write_text(THREE_TOML)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the broken test plugins installed beside
        executable = tvm.compile(zoo.get("cnn"), target="llvm", relax_pipeline="umahub")
        pipeline = relax.get_pipeline("umahub")
    assert type(pipeline).__name__ == "RelaxPipeline"
    # Placed on all three (a host-only executable would pass the rest): the partitions
    # the executable calls, one or more for each of npu, vanilla_accel and dsp_cpu.
    assert _partitions_called(executable) == [
        "dsp_cpu_1_relu",
        "npu_2_conv2d_add_relu",
        "npu_3_matmul_add",
        "vanilla_accel_0_conv2d_add",
    ]
    np.testing.assert_allclose(_tvm_vm(executable), host_reference("cnn"), rtol=1e-5, atol=1e-5)
    executable.export_library(str(isolated / "model.so"))
    exported = _tvm_vm(tvm.runtime.load_module(str(isolated / "model.so")))
    np.testing.assert_allclose(exported, host_reference("cnn"), rtol=1e-5, atol=1e-5)


def test_tvm_compile_with_a_hubs_relax_pipeline_places_on_all_three_plugins(three):
    hub, reference = three
    pipeline = hub.relax_pipeline()
    tvm.compile(zoo.get("cnn"), target="llvm", relax_pipeline=pipeline)
    used = {p.accelerator for p in pipeline.report.partitions}
    assert used == {"npu", "vanilla_accel", "dsp_cpu"}


def test_tvms_passes_and_pipelines_compose_around_umahubs_partitioning():
    ran = []

    @tvm.transform.module_pass(opt_level=0, name="Record")
    def record(mod, ctx):
        ran.append(re.findall(r'R.call_packed\("(\w+)"', mod["main"].script()))
        return mod

    hub = umahub.Hub(config={"plugins": ["npu"]}, project_config=False)
    after = tvm.transform.Sequential([record, relax.get_pipeline("default")])
    pipeline = tvm.transform.Sequential(
        [relax.transform.FoldConstant(), record, hub.relax_pipeline(then=after)]
    )
    executable = tvm.compile(zoo.get("cnn"), target="llvm", relax_pipeline=pipeline)
    assert ran == [[], ["npu_0_conv2d_add_relu", "npu_1_matmul_add"]]  # before, after umahub
    np.testing.assert_allclose(_tvm_vm(executable), host_reference("cnn"), rtol=1e-5, atol=1e-5)


def test_devices_are_those_the_vm_needs():
    hub = umahub.Hub(config={"plugins": ["npu"]}, project_config=False)
    pipeline = hub.relax_pipeline()
    executable = tvm.compile(zoo.get("cnn"), target="llvm", relax_pipeline=pipeline)
    assert pipeline.devices == [tvm.cpu(0)]
    vm = relax.VirtualMachine(executable, pipeline.devices)
    out = vm["main"](*[tvm.runtime.tensor(x) for x in zoo.inputs("cnn")]).numpy()
    np.testing.assert_allclose(out, host_reference("cnn"), rtol=1e-5, atol=1e-5)


def test_report_before_the_pipeline_ran_says_what_to_do():
    pipeline = umahub.Hub(config={"plugins": ["npu"]}, project_config=False).relax_pipeline()
    with pytest.raises(umahub.errors.UmahubError) as info:
        _ = pipeline.report
    assert str(info.value) == (
        "the umahub pipeline has not run yet: pass it to "
        "tvm.compile(mod, target, relax_pipeline=pipeline) first"
    )


def test_verify_is_not_silently_dropped():
    hub = umahub.Hub(config={"plugins": ["npu"], "verify": True}, project_config=False)
    message = "verify = true is not applied inside tvm.compile"
    with pytest.warns(umahub.UmahubWarning, match=message):
        tvm.compile(zoo.get("cnn"), target="llvm", relax_pipeline=hub.relax_pipeline())


@pytest.fixture
def simnpu_runtime():
    """The simnpu's runtime, whether or not its package is installed (a source checkout)."""
    from umahub_simnpu_runtime import SimNpuRuntime

    from umahub.runtime import devices

    devices.register_runtime(SimNpuRuntime())


def _device_warnings(caught):
    return [str(w.message) for w in caught if "device partition" in str(w.message)]


def test_by_name_a_device_partition_warns_that_tvms_export_cannot_carry_it(
    isolated, simnpu_runtime
):
    import umahub_simnpu  # noqa: F401  (the bundled device plugin, codegen "device")

    (isolated / "pyproject.toml").write_text('[tool.umahub]\nplugins = ["simnpu"]\n')
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        executable = tvm.compile(zoo.get("cnn_int8"), target="llvm", relax_pipeline="umahub")
    assert _device_warnings(caught) == [
        "umahub: device partitions simnpu_0_dequantize_dequantize_conv2d_dequantize_add_relu_etc, "
        "simnpu_1_dequantize_dequantize_conv2d_dequantize_add_relu_etc, "
        "simnpu_2_dequantize_dequantize_matmul_dequantize_add_quan_etc run on programs "
        "bound in this process only: TVM's export_library cannot carry them (the exported "
        "file fails elsewhere with 'Cannot find function umahub.device...'); for a library "
        "that carries them use umahub.Hub().compile(mod) and compiled.export_library(path)"
    ]
    vm = relax.VirtualMachine(executable, tvm.cpu())  # in this process it runs
    vm["main"](*[tvm.runtime.tensor(x) for x in zoo.inputs("cnn_int8")])


def test_with_a_pipeline_the_warning_names_pipeline_load(simnpu_runtime):
    import umahub_simnpu

    hub = umahub.Hub(config={"on-error": "error"}, autoload=False, plugins=[umahub_simnpu])
    pipeline = hub.relax_pipeline()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tvm.compile(zoo.get("cnn_int8"), target="llvm", relax_pipeline=pipeline)
    (said,) = _device_warnings(caught)
    assert said.endswith(
        "for a library that carries them use pipeline.load(executable).export_library(path)"
    )


def test_without_device_partitions_nothing_is_said_of_them():
    hub = umahub.Hub(config={"plugins": ["npu"]}, project_config=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tvm.compile(zoo.get("cnn"), target="llvm", relax_pipeline=hub.relax_pipeline())
    assert _device_warnings(caught) == []
