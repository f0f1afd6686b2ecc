"""Out-of-order backprop (Oh et al., EuroSys 2022): backward schedules that reorder
weight-gradient work."""
