"""Redraws curves-200ep.png from the metrics CSVs beside it (run from the
repository root: python docs/results/human_seg_long/plot_curves_200ep.py).
One colour per recipe, one line style per seed; the legend gives each
seed's test accuracy."""
import csv

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402

FOLDER = 'docs/results/human_seg_long/'
SEED_STYLES = ('-', '--', ':')
# recipe -> [(seed, test accuracy, metrics CSV)]
RECIPES = {
    'MetricMeshFormer': [(0, 90.02, 'metricformer-seed0-200ep.csv')],
    '+ copies': [(s, test, f'metricformer-aug1-seed{s}-200ep.csv')
                 for s, test in ((0, 90.47), (1, 90.98), (2, 90.82))],
    '+ subdivided copies': [(s, test, f'metricformer-aug1sub-seed{s}-200ep.csv')
                            for s, test in ((0, 91.03), (1, 90.49), (2, 90.96))],
    '+ subdivided copies, one mesh per step (chosen)': [
        (s, test, f'metricformer-aug1sub-bs1-seed{s}-200ep.csv')
        for s, test in ((0, 90.86), (1, 90.99), (2, 90.76))],
    'chosen, without weight decay': [
        (s, test, f'metricformer-aug1sub-bs1-wd0-seed{s}-200ep.csv')
        for s, test in ((0, 90.98), (1, 91.04), (2, 90.99))],
    'chosen, without weight decay, smoothed meshes': [
        (s, test, f'metricformer-aug1sub-bs1-wd0-taubin2-seed{s}-200ep.csv')
        for s, test in ((0, 91.19), (1, 91.08), (2, 90.98))],
    "chosen, no weight decay on phi's MLP": [
        (0, 91.02, 'metricformer-aug1sub-bs1-mlpwd0-seed0-200ep.csv')],
    # its training loss includes four times the cross entropy at the corners
    "chosen, corner_loss=4 (loss with the corner term)": [
        (0, 91.33, 'metricformer-aug1sub-bs1-corner4-seed0-200ep.csv'),
        (1, 91.27, 'metricformer-aug1sub-bs1-corner4-seed1-200ep.csv')],
    'DiffusionNet, this harness': [(s, test, f'diffusionnet-seed{s}-200ep.csv')
                                   for s, test in ((0, 90.11), (1, 90.22), (2, 90.88))],
}

fig, (loss_axes, acc_axes) = plt.subplots(1, 2, figsize=(14, 5))
for index, (recipe, runs) in enumerate(RECIPES.items()):
    color = plt.get_cmap('tab10').colors[index]
    for seed, test, name in runs:
        with open(FOLDER + name) as file:
            rows = list(csv.DictReader(file))
        epochs = [int(row['epoch']) for row in rows]
        style = dict(color=color, linestyle=SEED_STYLES[seed], linewidth=1)
        loss_axes.plot(epochs, [float(row['train_loss']) for row in rows], **style)
        acc_axes.plot(epochs, [100 * float(row['val_face_acc']) for row in rows],
                      label=f'{recipe}, seed {seed} (test {test:.2f})', **style)
loss_axes.set(yscale='log', xlabel='epoch', ylabel='training loss')
acc_axes.set(xlabel='epoch', ylabel='validation face accuracy (%)', ylim=(94, 98))
acc_axes.legend(loc='center left', bbox_to_anchor=(1.02, 0.5), fontsize=7)
fig.suptitle('human_seg, 200 epochs, 38 training meshes held out')
fig.tight_layout()
fig.savefig(FOLDER + 'curves-200ep.png', dpi=110)
