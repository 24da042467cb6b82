"""The step prices the loop charges: the roofline and serving models' constants, a calibrated
model's, a measured table's."""
