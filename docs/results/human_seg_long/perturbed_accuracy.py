"""The 200-epoch formers' face accuracy on the perturbed meshes themselves,
not their drops: tables and perturbed-accuracy-200ep.png from the
robustness JSONs beside this file (written by ``experiment
human_seg_robust``; run from the repository root: python
docs/results/human_seg_long/perturbed_accuracy.py). Validation: one draw
per perturbation; test: three draws (subdivision: one, it draws nothing);
each cell the mean over the recipe's seeds."""
import json
from statistics import mean

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402

FOLDER = 'docs/results/human_seg_long/'
KINDS = ('original', 'subdivision', 'decimation', 'anisotropic_scaling',
         'jitter')
# recipe -> {split: robustness JSON files (every run in them counts)}
RECIPES = {
    'the chosen recipe': dict(
        val=['robustness-val-former200-aug1sub-bs1.json',
             'robustness-val-former200-aug1sub-bs1-seed1.json',
             'robustness-val-former200-aug1sub-bs1-seed2.json'],
        test=['robustness-former200-aug1sub-bs1-draws3.json']),
    'without weight decay': dict(
        val=['robustness-val-former200-aug1sub-bs1-wd0.json'],
        test=['robustness-former200-aug1sub-bs1-wd0-draws3.json']),
    'without weight decay, smoothed operators': dict(
        val=['robustness-val-former200-aug1sub-bs1-wd0-taubin2.json'],
        test=['robustness-former200-aug1sub-bs1-wd0-taubin2-draws3.json']),
    'corner_loss=4': dict(
        val=['robustness-val-former200-aug1sub-bs1-corner4-seed0.json',
             'robustness-val-former200-aug1sub-bs1-corner4-seed1.json']),
    "no weight decay on phi's MLP": dict(
        val=['robustness-val-former200-aug1sub-bs1-mlpwd0-seed0.json']),
    "this harness's DiffusionNet": dict(
        test=['robustness-dn200-seed2-draws3.json',
              ('robustness-former200-aug1sub-dn200-draws3.json', 'hs200-dn-')]),
}


def accuracies(files) -> tuple[dict[str, float], int]:
    """``({kind: mean face accuracy (%) over the runs}, number of runs)``;
    a ``(file, prefix)`` entry takes only the runs whose folder name starts
    with ``prefix``."""
    per_kind: dict[str, list[float]] = {kind: [] for kind in KINDS}
    runs = 0
    for entry in files:
        name, prefix = entry if isinstance(entry, tuple) else (entry, '')
        for run in json.load(open(FOLDER + name))['runs']:
            if not run['run'].rstrip('/').split('/')[-1].startswith(prefix):
                continue
            runs += 1
            rows = {row['perturbation']: row for row in run['rows']}
            for kind in KINDS:
                per_kind[kind].append(100 * rows[kind]['face_acc'])
    return {kind: mean(values) for kind, values in per_kind.items()}, runs


def main() -> None:
    readings = {split: {name: accuracies(files[split])
                        for name, files in RECIPES.items() if split in files}
                for split in ('val', 'test')}
    for split, recipes in readings.items():
        print(f'\n{split}: face accuracy (%) on each set of meshes\n')
        print('| recipe | seeds | ' + ' | '.join(KINDS) + ' | worst perturbed |')
        print('|---|---|' + '---|' * (len(KINDS) + 1))
        for name, (values, runs) in recipes.items():
            print(f'| {name} | {runs} | ' + ' | '.join(
                f'{values[kind]:.2f}' for kind in KINDS)
                + f' | {min(values[kind] for kind in KINDS[1:]):.2f} |')
    colors = dict(zip(RECIPES, plt.get_cmap('tab10').colors, strict=False))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, (split, recipes) in zip(axes, readings.items(), strict=True):
        for name, (values, runs) in recipes.items():
            ax.plot(range(len(KINDS)), [values[kind] for kind in KINDS],
                    marker='o', color=colors[name],
                    label=f'{name} ({runs} seeds)')
        ax.set_xticks(range(len(KINDS)), [kind.replace('_', '\n')
                                          for kind in KINDS])
        ax.set(title=f'{split} meshes', ylabel='face accuracy (%)')
        ax.legend(fontsize=7)
    fig.suptitle('human_seg, 200 epochs: accuracy on the perturbed meshes')
    fig.tight_layout()
    fig.savefig(FOLDER + 'perturbed-accuracy-200ep.png', dpi=110)


if __name__ == '__main__':
    main()
