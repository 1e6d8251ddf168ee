"""Files and data: the cache folder, checkpoint layouts, data files, safetensors helpers and output
folders."""
