"""``traind launch``: rent or reach a GPU host, bring traind up on it, bring results back."""
