"""Presets: host read from a (fake) sysfs tree, and the GPU figures."""
import pytest

from cachetile.models.hardware import hardware_from, host, preset


def fake_cache(root, entries):
    for i, (level, ctype, size) in enumerate(entries):
        d = root / f"index{i}"
        d.mkdir(parents=True)
        (d / "level").write_text(f"{level}\n")
        (d / "type").write_text(f"{ctype}\n")
        (d / "size").write_text(f"{size}\n")


def test_host_reads_data_caches_and_skips_instruction_cache(tmp_path):
    fake_cache(tmp_path, [(1, "Data", "32K"), (1, "Instruction", "32K"), (2, "Unified", "1024K"), (3, "Unified", "32768K")])
    hw = host(str(tmp_path))
    assert [lv.name for lv in hw.levels] == ["registers", "L1", "L2", "L3"]
    assert [lv.capacity_bytes for lv in hw.levels[1:]] == [32 * 1024, 1024 * 1024, 32 * 1024 * 1024]
    assert hw.levels[0].capacity_bytes in (16 * 16, 16 * 32, 32 * 64)  # SSE, AVX2 or AVX-512 register file
    # DRAM feeds the last cache: the slowest link; caches are filled faster the closer they sit.
    bws = [lv.bandwidth_bytes_per_s for lv in hw.levels]
    assert bws[1:] == sorted(bws[1:], reverse=True) and bws[-1] == min(bws)


def test_gpu_presets_have_registers_shared_l2():
    for name, smem, l2 in (("h100", 227, 50), ("a100", 163, 40), ("v100", 96, 6)):
        hw = preset(name)
        assert [lv.name for lv in hw.levels] == ["registers", "shared", "L2"]
        assert hw.levels[1].capacity_bytes == smem * 1024
        assert hw.levels[2].capacity_bytes == l2 * 2**20
        assert hw.source and "whitepaper" in hw.source


def test_hardware_from_dict_and_errors():
    hw = hardware_from({"name": "x", "levels": [{"name": "a", "capacity_bytes": 1, "bandwidth_bytes_per_s": 1}], "peak_flops": 1})
    assert hw.levels[0].name == "a"
    with pytest.raises(ValueError, match="unknown hardware 'tpu'"):
        hardware_from("tpu")
