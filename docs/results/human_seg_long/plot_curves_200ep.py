"""Redraws curves-200ep.png from the metrics CSVs beside it (run from the
repository root: python docs/results/human_seg_long/plot_curves_200ep.py)."""
import csv

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402

FOLDER = 'docs/results/human_seg_long/'
RUNS = {
    'MetricMeshFormer, seed 0 (test 90.02)': 'metricformer-seed0-200ep.csv',
    'MetricMeshFormer + copies, seed 0 (test 90.47)':
        'metricformer-aug1-seed0-200ep.csv',
    'MetricMeshFormer + copies, seed 1 (test 90.98)':
        'metricformer-aug1-seed1-200ep.csv',
    'MetricMeshFormer + copies, seed 2 (test 90.82)':
        'metricformer-aug1-seed2-200ep.csv',
    'MetricMeshFormer + subdivided copies, seed 0 (test 91.03)':
        'metricformer-aug1sub-seed0-200ep.csv',
    'MetricMeshFormer + subdivided copies, seed 1 (test 90.49)':
        'metricformer-aug1sub-seed1-200ep.csv',
    'MetricMeshFormer + subdivided copies, seed 2 (test 90.96)':
        'metricformer-aug1sub-seed2-200ep.csv',
    'MetricMeshFormer + subdivided copies, one mesh per step, seed 0 '
    '(test 90.86)': 'metricformer-aug1sub-bs1-seed0-200ep.csv',
    'MetricMeshFormer + subdivided copies, one mesh per step, seed 1 '
    '(test 90.99)': 'metricformer-aug1sub-bs1-seed1-200ep.csv',
    'MetricMeshFormer + subdivided copies, one mesh per step, seed 2 '
    '(test 90.76)': 'metricformer-aug1sub-bs1-seed2-200ep.csv',
    'DiffusionNet, this harness, seed 0 (test 90.11)':
        'diffusionnet-seed0-200ep.csv',
    'DiffusionNet, this harness, seed 1 (test 90.22)':
        'diffusionnet-seed1-200ep.csv',
}

fig, (loss_axes, acc_axes) = plt.subplots(1, 2, figsize=(11, 4.6))
for label, name in RUNS.items():
    with open(FOLDER + name) as file:
        rows = list(csv.DictReader(file))
    epochs = [int(row['epoch']) for row in rows]
    loss_axes.plot(epochs, [float(row['train_loss']) for row in rows], label=label)
    acc_axes.plot(epochs, [100 * float(row['val_face_acc']) for row in rows],
                  label=label)
loss_axes.set(yscale='log', xlabel='epoch', ylabel='training loss')
acc_axes.set(xlabel='epoch', ylabel='validation face accuracy (%)', ylim=(90, 98))
acc_axes.legend(loc='lower right', fontsize=7)
fig.suptitle('human_seg, 200 epochs, 38 training meshes held out')
fig.tight_layout()
fig.savefig(FOLDER + 'curves-200ep.png', dpi=110)
