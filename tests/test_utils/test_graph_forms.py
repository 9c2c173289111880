"""The graph-form switch: a registered form runs inside ``graph_forms`` only, and every
module gets its own forward back on exit (also after an error)."""
import pytest
import torch
import torch.nn as nn

from polaformer_mm.utils.graph_forms import graph_form_of, graph_forms, register_graph_form


class _Doubling(nn.Module):

    def forward(self, x):
        return 2 * x


class _Subclass(_Doubling):
    pass


def _add_one(module, x):
    return x + 1


def test_a_registered_form_runs_inside_the_block_only():
    register_graph_form(_Doubling, _add_one)
    model = nn.Sequential(nn.Identity(), _Subclass())
    x = torch.ones(2)
    assert graph_form_of(model[1]) is _add_one  # inherited from the base class
    assert graph_form_of(model[0]) is None
    with graph_forms(model) as names:
        assert names == ['1']
        assert torch.equal(model(x), x + 1)
        assert torch.equal(torch.jit.trace(model, x)(x * 3), x * 3 + 1)
    assert torch.equal(model(x), 2 * x)
    assert 'forward' not in model[1].__dict__


def test_the_forwards_come_back_after_an_error():
    register_graph_form(_Doubling, _add_one)
    model = _Doubling()
    with pytest.raises(RuntimeError, match='inside'):
        with graph_forms(model):
            raise RuntimeError('inside')
    assert torch.equal(model(torch.ones(1)), torch.full((1, ), 2.))


def test_registering_something_else_is_named():
    with pytest.raises(TypeError, match='nn.Module class'):
        register_graph_form(object, _add_one)
    with pytest.raises(TypeError, match='must be callable'):
        register_graph_form(_Doubling, 3)
