"""The graph-capture switch: set by hand or by the export tools, detected under a trace."""
import torch

from polaformer_mm.utils.capture import exportable, graph_capture, is_exportable, set_exportable


def test_exportable_is_scoped_and_restores_the_previous_value():
    assert not is_exportable() and not graph_capture()
    with exportable():
        assert is_exportable() and graph_capture()
        with exportable(False):
            assert not is_exportable() and not graph_capture()
        assert is_exportable()
    assert not is_exportable()
    assert set_exportable(True) is False
    try:
        assert graph_capture()
    finally:
        assert set_exportable(False) is True
    assert not graph_capture()


def test_a_trace_is_a_graph_capture():
    seen = []

    def record(x):
        seen.append(graph_capture())
        return x * 2

    torch.jit.trace(record, torch.ones(2), check_trace=False)
    record(torch.ones(2))
    assert seen == [True, False]
