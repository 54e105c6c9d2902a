"""Full-batch training on a fixed graph, each step replayed as one CUDA graph.

    python examples/fixed_graph_training.py [--steps 200]          # torch.compile
    python examples/fixed_graph_training.py --capture cuda-graph   # torch.cuda.graphs
    python examples/fixed_graph_training.py --device cpu --nodes 40 --edges 160 \\
        --features 16 --heads 2 --steps 3  # the compiled loop on a CPU (slow)

A graph the size of Cora (2,708 nodes, 10,556 edges, 1,433 features, 7
classes; random here, ``torch_geometric.datasets.Planetoid`` gives the real
one) and a two-layer MetricAttentionConv model with the Triton backend. On a
GPU a step this small is bound by the host (launching kernels), not by the
kernels, so it pays to record the whole training step once and replay it.
Two ways, both after **one eager call that prepares the graph**: the layer
checks it, replaces its self-loops, sorts it and builds the kernels'
schedules, reading some sizes back to the host (which no CUDA graph can
hold), and caches all of that on the ``edge_index`` tensor.

``--capture compile`` (the default): ``torch.compile(model, fullgraph=True,
mode='reduce-overhead')``. Dynamo reads the cached structures as inputs of
the compiled graph instead of tracing their construction, so forward and
backward are one graph, which Inductor records as a CUDA graph (the cached
tensors are marked static: read in place, never copied in). Every step calls
``torch.compiler.cudagraph_mark_step_begin()``, the compiled model,
``loss.backward()`` and the optimizer.

``--capture cuda-graph``, without compiling: warm up a few eager steps on a
side stream (Triton compiles its kernels there, the optimizer makes its
state), then record forward, backward and ``optimizer.step()`` (an optimizer
made with ``capturable=True``) under ``torch.cuda.graph`` and call
``replay()`` per step. The recorded step reads its inputs from the same
tensors every time: copy new data into them, never rebind them.

Either way, keep the same ``x`` and ``edge_index`` tensors: a compiled step
recompiles for a new ``edge_index`` and does not see an in-place change of
it (give a changed graph a new tensor and prepare it again).

Without CUDA the script says so and stops, unless ``--device cpu``: then the
compiled loop runs with Triton's interpreter (``TRITON_INTERPRET=1``) and the
``aot_eager`` backend (no CUDA graph, no Inductor), which only shows that
the step compiles to one graph; use small sizes.
"""
from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--capture', choices=['compile', 'cuda-graph'],
                        default='compile')
    parser.add_argument('--device', default='cuda')
    parser.add_argument('--nodes', type=int, default=2_708)
    parser.add_argument('--edges', type=int, default=10_556)
    parser.add_argument('--features', type=int, default=1_433)
    parser.add_argument('--classes', type=int, default=7)
    parser.add_argument('--heads', type=int, default=8)
    parser.add_argument('--steps', type=int, default=200)
    return parser.parse_args(argv)


def compiled_step(model, optimizer, loss_of: Callable) -> Callable:
    """The training step with the model compiled: a CUDA graph on a GPU,
    ``aot_eager`` elsewhere."""
    import torch

    on_gpu = next(model.parameters()).is_cuda
    compiled = (torch.compile(model, fullgraph=True, mode='reduce-overhead')
                if on_gpu else
                torch.compile(model, fullgraph=True, backend='aot_eager'))

    def step():
        optimizer.zero_grad(set_to_none=True)
        if on_gpu:
            torch.compiler.cudagraph_mark_step_begin()
        loss = loss_of(compiled)
        loss.backward()
        optimizer.step()
        return loss.detach()
    return step


def cuda_graph_step(model, optimizer, loss_of: Callable) -> Callable:
    """The training step recorded once with ``torch.cuda.graph`` and
    replayed (``optimizer`` made with ``capturable=True``)."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: kernels compiled, state made
        for _ in range(3):
            optimizer.zero_grad(set_to_none=True)
            loss_of(model).backward()
            optimizer.step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    optimizer.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        static_loss = loss_of(model)
        static_loss.backward()
        optimizer.step()

    def step():
        graph.replay()
        return static_loss.detach()
    return step


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.device == 'cpu':  # before anything imports triton
        os.environ.setdefault('TRITON_INTERPRET', '1')
    import torch
    import torch.nn.functional as F

    from pyg_metric_attn import MetricAttentionConv

    if args.device == 'cpu' and args.capture == 'cuda-graph':
        sys.exit('--capture cuda-graph records a CUDA graph: it needs a GPU')
    if args.device.startswith('cuda') and not torch.cuda.is_available():
        print('No CUDA device: this example records a training step as a CUDA '
              'graph (torch.compile(mode="reduce-overhead"), or '
              'torch.cuda.graphs with --capture cuda-graph), which needs one. '
              'Run it on a GPU, or with --device cpu (small sizes) to see the '
              'compiled loop become one graph in Triton\'s interpreter.')
        return

    class Net(torch.nn.Module):
        def __init__(self, in_channels: int, hidden: int, classes: int,
                     heads: int):
            super().__init__()
            self.conv1 = MetricAttentionConv(in_channels, hidden, heads=heads,
                                             time_scale='matched', dropout=0.1,
                                             backend='triton')
            self.conv2 = MetricAttentionConv(hidden * heads, classes,
                                             time_scale='matched',
                                             backend='triton')

        def forward(self, x, edge_index):
            return self.conv2(F.elu(self.conv1(x, edge_index)), edge_index)

    device = torch.device(args.device)
    torch.manual_seed(0)
    x = torch.randn(args.nodes, args.features, device=device)
    edge_index = torch.randint(0, args.nodes, (2, args.edges), device=device)
    y = torch.randint(0, args.classes, (args.nodes,), device=device)
    train = torch.rand(args.nodes, device=device) < 0.3
    model = Net(args.features, 8, args.classes, args.heads).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.005, weight_decay=5e-4,
                                 capturable=args.capture == 'cuda-graph')

    def loss_of(net):
        return F.cross_entropy(net(x, edge_index)[train], y[train])

    with torch.no_grad():  # prepares (and caches) the graph
        model(x, edge_index)
    make_step = compiled_step if args.capture == 'compile' else cuda_graph_step
    step = make_step(model, optimizer, loss_of)
    for number in range(1, args.steps + 1):
        loss = step()
        if number in (1, args.steps) or number % 50 == 0:
            print(f'step {number}: loss {float(loss):.4f}')
    with torch.no_grad():
        model.eval()
        accuracy = (model(x, edge_index).argmax(1) == y)[~train].float().mean()
    print(f'held-out accuracy {float(accuracy):.3f} (random labels: about '
          f'{1 / args.classes:.2f})')


if __name__ == '__main__':
    main(sys.argv[1:])
