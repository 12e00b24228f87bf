"""Flow control: the model providers' limits shared by the cluster (docs/operating.md#meeting-your-providers-limits)."""
