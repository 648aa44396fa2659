"""The host side: supervisors, jobs, the run directory, handles, run trees and the `Runtime`."""
