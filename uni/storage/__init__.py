"""Storage policies: where a tensor's elements live and how a handle to them is leased."""

from uni.storage._base import StorageBase as StorageBase
from uni.storage._protocol import Region as Region
from uni.storage._protocol import Storage as Storage
from uni.storage._recover import Recovery as Recovery
from uni.storage._recover import recover as recover
from uni.storage.host import HostStorage as HostStorage
from uni.storage.mapped import MappedFileStorage as MappedFileStorage

__all__ = ["HostStorage", "MappedFileStorage", "Recovery", "Region", "Storage", "StorageBase",
           "recover"]
