"""tr_model.plots: files by extension, atomic writes, labels, B* marked, no pyplot state leaks."""

import os
import struct

import pytest

import tr_model
from tr_core.errors import SpecError
from tr_model.plots import plot_throughput, save_figure, throughput_figure

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def r2r_optima():
    spec = tr_model.preset("r2r", [6.0, 27.9], p=0.35)
    return tr_model.optimize_many(spec, [2, 4])


@pytest.fixture(scope="module")
def me_optima():
    spec = tr_model.preset("me", [6.0, 15.0, 27.9], weights=[0.5, 0.3, 0.2])
    return tr_model.optimize_many(spec, [3])


def test_png_written_with_valid_header_and_size(tmp_path, r2r_optima):
    out = tmp_path / "t.png"
    plot_throughput(r2r_optima, out)
    data = out.read_bytes()
    assert data[:8] == PNG_MAGIC
    # IHDR: width and height, big-endian, right after the chunk header
    assert data[12:16] == b"IHDR"
    w, h = struct.unpack(">II", data[16:24])
    assert w > 300 and h > 200
    # nothing but the plot is left in the folder (temp file renamed away)
    assert sorted(os.listdir(tmp_path)) == ["t.png"]


def test_svg_has_axis_labels_and_the_reference_bstar(tmp_path, r2r_optima):
    out = tmp_path / "t.svg"
    plot_throughput(r2r_optima, str(out))
    text = out.read_text()
    assert text.lstrip().startswith("<?xml") and "<svg" in text
    assert "B1: large-model threshold (requests)" in text
    assert "throughput (tokens/s, all N requests)" in text
    # the model page's reference values: B*(N=2) = (1, 2), B*(N=4) = (1, 3) at 207.95 tok/s
    assert "B* = (1, 2)" in text
    assert "N = 4: B* = (1, 3), 208.0 tok/s" in text
    assert "eager B = (1, 1): 187.2" in text


def test_pdf_and_uppercase_extension(tmp_path, r2r_optima):
    plot_throughput(r2r_optima, tmp_path / "t.pdf")
    assert (tmp_path / "t.pdf").read_bytes()[:5] == b"%PDF-"
    plot_throughput(r2r_optima, tmp_path / "T.PNG")
    assert (tmp_path / "T.PNG").read_bytes()[:8] == PNG_MAGIC


@pytest.mark.parametrize("name", ["t.jpg", "t", "t.png.txt"])
def test_bad_extension_is_a_spec_error_and_writes_nothing(tmp_path, r2r_optima, name):
    with pytest.raises(SpecError, match="unsupported extension"):
        plot_throughput(r2r_optima, tmp_path / name)
    assert os.listdir(tmp_path) == []


def test_empty_or_wrong_input_is_a_spec_error(tmp_path):
    with pytest.raises(SpecError):
        plot_throughput([], tmp_path / "t.png")
    with pytest.raises(SpecError):
        plot_throughput([1, 2], tmp_path / "t.png")


def test_unwritable_folder_is_a_spec_error(tmp_path, r2r_optima):
    with pytest.raises(SpecError, match="cannot write plot"):
        plot_throughput(r2r_optima, tmp_path / "missing" / "t.png")


def test_replaces_an_existing_file(tmp_path, r2r_optima):
    out = tmp_path / "t.png"
    out.write_bytes(b"old")
    plot_throughput(r2r_optima, out)
    assert out.read_bytes()[:8] == PNG_MAGIC


def test_heatmap_when_many_b0_values(tmp_path):
    spec = tr_model.preset("r2r", [6.0, 27.9], p=0.35)
    opts = tr_model.optimize_many(spec, [8])
    out = tmp_path / "h.svg"
    plot_throughput(opts, out)
    text = out.read_text()
    assert "B0: small-model threshold (requests)" in text
    assert "B* = (1, 5)" in text  # README's example table, N = 8


def test_ranked_dots_for_three_models(tmp_path, me_optima):
    out = tmp_path / "m.svg"
    plot_throughput(me_optima, out)
    text = out.read_text()
    assert "threshold vector B (top 10 of 10)" in text  # C(3 - 1 + 3, 3) = 10 feasible vectors at N = 3
    assert f"B* = ({', '.join(map(str, me_optima[0].best_B))})" in text


def test_no_pyplot_figures_or_rcparams_leak(tmp_path, r2r_optima):
    import matplotlib
    import matplotlib.pyplot as plt

    before = dict(matplotlib.rcParams)
    n_figs = len(plt.get_fignums())
    fig = throughput_figure(r2r_optima)
    save_figure(fig, tmp_path / "x.svg")
    assert len(plt.get_fignums()) == n_figs
    assert dict(matplotlib.rcParams) == before


def test_simulated_optimum_is_plotted_with_its_ratio_gain(tmp_path):
    simulator = pytest.importorskip("simulator")
    spec = tr_model.preset("r2r", [6.0, 27.9], p=0.35)
    o = simulator.optimize_by_simulation(spec, 4, budget_s=1.5, seed=1)
    out = tmp_path / "sim.svg"
    plot_throughput([o], out)
    text = out.read_text()
    assert "(simulated)" in text
    # the model page's B*(N = 4) = (1, 3) is 11 % above eager: far outside the simulator's noise
    assert "B* = (1, 3)" in text
    ratio = o.throughput_tok_s / o.eager_throughput_tok_s
    assert 1.08 < ratio < 1.14
    assert f"({ratio:.3f}x eager)" in text


def test_check_plot_path(tmp_path):
    from tr_model.plots import check_plot_path

    assert check_plot_path(tmp_path / "a.PDF") == "pdf"
    assert check_plot_path(str(tmp_path / "a.svg")) == "svg"
    with pytest.raises(SpecError, match="unsupported extension"):
        check_plot_path(tmp_path / "a.gif")
    with pytest.raises(SpecError, match="does not exist"):
        check_plot_path(tmp_path / "nope" / "a.png")


def test_gain_figure_labels_bstar(tmp_path, r2r_optima):
    from tr_model.plots import gain_figure

    save_figure(gain_figure(r2r_optima), tmp_path / "g.svg")
    text = (tmp_path / "g.svg").read_text()
    assert "gain over eager (x)" in text and "concurrency N (requests)" in text
    assert "(1, 2)" in text and "(1, 3)" in text  # B*(2), B*(4) from the model page
