"""Calibration: time real draft/target forward passes and the verification kernel, write a profile.

Run ``python -m calibrate --help``. Needs only torch, numpy and pandas. Importing this
package stays torch-free (torch is imported by the modules that run models), so the
``specbatch calibrate`` subcommand can parse and check its flags without torch.
"""
