"""Files shipped for building runtime images."""
