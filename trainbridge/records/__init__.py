"""Modded-NanoGPT record comparisons: read records out of a checkout or its logs
(`extract`), scale each script to the machine (`scale`), and run the optimization loop on
each to compare port vs optimized step time (`compare`)."""
