"""Storage backends behind one small Protocol (see ``base.py``)."""
