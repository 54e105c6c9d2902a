"""Mesh data sets: the human segmentation benchmark, any folder of meshes and
procedural humanoids."""
from pyg_metric_attn.datasets.human_segmentation import HumanSegmentation
from pyg_metric_attn.datasets.mesh_dataset import MeshDataset, majority_label, mesh_data
from pyg_metric_attn.datasets.mesh_folder import MeshFolder
from pyg_metric_attn.datasets.synthetic_humans import BODY_PARTS, SyntheticHumans

__all__ = ['BODY_PARTS', 'HumanSegmentation', 'MeshDataset', 'MeshFolder',
           'SyntheticHumans', 'majority_label', 'mesh_data']
