"""The scheduler side: the pull queue, leases, placement, the online queue, elastic scaling, the dashboard."""
