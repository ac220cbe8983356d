"""The run report: worker files, the bound document, its rendering, the driver's finalize."""
