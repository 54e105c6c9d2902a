from pyg_metric_attn.nn.models.ipn import ATTENTIONS, IPN, propagation_module

__all__ = ['ATTENTIONS', 'IPN', 'propagation_module']
