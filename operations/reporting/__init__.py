"""Reporting, apart from the operations: the sweep's results tables and crossover (``tables``) and charts (``plot``)."""
