"""World-model fidelity against real execution (``wmrl wm-fidelity``)."""
