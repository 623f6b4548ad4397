"""One deployment of several processes: the instance registry and its leases, admin changes
confirmed by every instance, background tasks."""
