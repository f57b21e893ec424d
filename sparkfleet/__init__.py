"""sparkfleet: orchestrate LLM serving lanes on a DGX Spark fleet and a DGX Station GB300."""

__version__ = "0.1.0"
