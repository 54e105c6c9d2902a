"""Speed and memory of metric-attention against PyG's attention layers and SDPA.

    python -m benchmarks.run --suite sparse|dense|all [--quick]

Every configuration runs in a fresh process (:mod:`benchmarks.measure`) under
a memory cap and a timeout; :mod:`benchmarks.run` collects the results into
JSON and a Markdown table of absolute numbers and ratios to the baseline
measured in the same run. :mod:`benchmarks.cases` defines what is measured.
"""
