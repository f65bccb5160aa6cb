"""Byte units, written once. Memory is reported in binary units (MiB, GiB: what `torch.cuda` counts
in and what the report prints); bandwidths and the accounting's hardware sizes in decimal ones (GB,
as datasheets give them). Bucket sizes are in MiB, as PyTorch DDP's `bucket_cap_mb`."""

KIB = 2**10
MIB = 2**20
GIB = 2**30
GB = 1e9
