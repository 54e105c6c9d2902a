"""Data sets: the human segmentation benchmark, any folder of meshes,
procedural humanoids, MNIST (IDX files), Multi30k with its subword
tokenizer, and a synthetic node-classification graph (stochastic block model)."""
from pyg_metric_attn.datasets.batching import bucket_batches, pad_sequences
from pyg_metric_attn.datasets.human_segmentation import HumanSegmentation
from pyg_metric_attn.datasets.idx import IDXFormatError, read_idx
from pyg_metric_attn.datasets.mesh_dataset import MeshDataset, majority_label, mesh_data
from pyg_metric_attn.datasets.mesh_folder import MeshFolder
from pyg_metric_attn.datasets.mnist import MNIST
from pyg_metric_attn.datasets.multi30k import Multi30k
from pyg_metric_attn.datasets.stochastic_block import stochastic_block_graph
from pyg_metric_attn.datasets.subword import SPECIAL_TOKENS, SubwordTokenizer
from pyg_metric_attn.datasets.synthetic_humans import BODY_PARTS, SyntheticHumans

__all__ = ['BODY_PARTS', 'HumanSegmentation', 'IDXFormatError', 'MNIST',
           'MeshDataset', 'MeshFolder', 'Multi30k', 'SPECIAL_TOKENS',
           'SubwordTokenizer', 'SyntheticHumans', 'bucket_batches',
           'majority_label', 'mesh_data', 'pad_sequences', 'read_idx',
           'stochastic_block_graph']
