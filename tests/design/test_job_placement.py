"""Where the loop says a training job trains: split over the devices, whole on one, or process 0's alone."""

from jaxrace.design.loop import job_placement


def test_job_placement_names_the_split_and_what_would_use_every_device():
    assert job_placement(3, 1, 1) is None
    assert job_placement(4, 2, 1) == "4 runs split over 2 devices, 2 on each"
    assert job_placement(3, 2, 1) == ("3 runs do not split over the 2 devices: trained whole on one "
                                      "(N x seeds a multiple of 2 would use them all)")
    assert job_placement(6, 4, 2) == ("6 runs do not split over the 4 devices of 2 processes: "
                                      "trained by process 0 alone")
    assert job_placement(4, 4, 2) == "4 runs split over 4 devices, 1 on each"
